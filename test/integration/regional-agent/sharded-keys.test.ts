import calculateSlot from 'cluster-key-slot';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { shardKey } from '../../../core/keys.js';
import { parsePolicy, PolicySpec } from '../../../core/policy/policy.js';
import { uniquePrefix } from '../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

const version = Number(uniquePrefix('').replace(/\D/g, '').slice(0, 5)) + 2;
const ceiling = parsePolicy({ name: 'ceiling', capacity: 100, refillPerSecond: 1e-4, shards: 4, version });
// Fails open: a decision the store did not make is an admission, so one the store refused is counted as such.
const orders = parsePolicy({
  name: 'orders',
  capacity: 8,
  refillPerSecond: 1e-4,
  shards: 2,
  version,
  onStoreFailure: 'open',
});

let agent: AgentFixture;
let draws = 0;

beforeAll(async () => {
  agent = await agentFixture({
    policies: [ceiling, orders],
    shares: { ceiling: 0.5 },
    redis: 'cluster',
    // Round-robin over the shards, so the test knows where every check lands.
    deps: { random: () => (draws++ % 4) / 4 + 0.01 },
    config: { reservationSweepMs: 0 },
  });
});
afterAll(async () => {
  await agent[Symbol.asyncDispose]();
});

describe('sharded hot keys on a real 3-master Redis Cluster', () => {
  it('the schema refuses shards that cannot hold maxCost, or on another kind', () => {
    expect(PolicySpec.safeParse({ capacity: 10, refillPerSecond: 1, maxCost: 5, shards: 4 }).success).toBe(
      false,
    );
    expect(
      PolicySpec.safeParse({ kind: 'sliding_log', capacity: 10, windowSeconds: 60, shards: 2 }).success,
    ).toBe(false);
    expect(PolicySpec.safeParse({ capacity: 10, refillPerSecond: 1, shards: 65 }).success).toBe(false);
  });

  it('a share of 0.5 of 100 over 4 shards: 500 racing callers admit exactly 48 (12 whole of 12.5 per shard), never more', async () => {
    const subject = 'all';
    const slots = new Set([0, 1, 2, 3].map((k) => calculateSlot(shardKey(version, subject, 'ceiling', k))));
    expect(slots.size).toBe(4);
    const all = await Promise.all(
      Array.from({ length: 500 }, async () => {
        const res = await agent.app.inject({
          method: 'POST',
          url: '/v1/decisions',
          payload: { policy: 'ceiling', subject },
        });
        return DecisionResponse.parse(res.json());
      }),
    );
    // Each shard holds 100 × 0.5 / 4 = 12.5 tokens: 12 whole admissions each.
    expect(all.filter((d) => d.allowed)).toHaveLength(48);
    const denied = all.filter((d) => !d.allowed);
    expect(denied.every((d) => d.results[0]!.reason === 'shard_exhausted')).toBe(true);
    expect(all.filter((d) => d.allowed).every((d) => d.results[0]!.limit === 12)).toBe(true);
  });

  it('idempotency keys on a sharded policy: each call decided on its sub-bucket, a retry replayed (not 20 admitted by fail-open)', async () => {
    const decide = async (idempotencyKey: string) => {
      const res = await agent.app.inject({
        method: 'POST',
        url: '/v1/decisions',
        payload: { policy: 'orders', subject: 'all', idempotencyKey },
      });
      expect(res.statusCode).toBe(200);
      return DecisionResponse.parse(res.json());
    };
    const all: DecisionResponse[] = [];
    for (let i = 0; i < 20; i++) all.push(await decide(`order-${i}`));
    // Before: the record key (slot of {all}) and the sub-bucket ({all#k}) spanned two slots, every call was refused
    // as CROSSSLOT and answered by the failure mode: 20 of 20 admitted, `fail_open`, nothing charged.
    expect(all.filter((d) => d.results[0]!.reason === 'fail_open')).toHaveLength(0);
    // Two sub-buckets of 4: 8 admitted, whichever keys drew which.
    expect(all.filter((d) => d.allowed)).toHaveLength(8);
    const first = all.findIndex((d) => d.allowed);
    const retry = await decide(`order-${first}`);
    expect(retry).toMatchObject({ allowed: true, replayed: true });
  });
});
