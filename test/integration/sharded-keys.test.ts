import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { DecisionResponse } from '../../core/agent-wire.js';
import { shardKey } from '../../core/keys.js';
import { parsePolicy, PolicySpec } from '../../core/policy.js';
import { StaticShareView } from '../../core/shares.js';
import { buildApp, type AgentApp } from '../../regional-agent/app.js';
import { AgentConfig } from '../../regional-agent/config.js';
import { StaticPolicySource } from '../../regional-agent/policies/static-policy-source.js';
import { connectRedis, whenReady } from '../../regional-agent/redis/connect.js';
import { RedisDecisionStore } from '../../regional-agent/redis/decision-store.js';
import { uniquePrefix } from '../harness/fixtures.js';

const version = Number(uniquePrefix('').replace(/\D/g, '').slice(0, 5)) + 2;
const ceiling = parsePolicy({ name: 'ceiling', capacity: 100, refillPerSecond: 1e-4, shards: 4, version });

let cluster: Cluster;
let agent: AgentApp;
let draws = 0;

beforeAll(async () => {
  const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
  cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
  cluster.on('error', () => undefined);
  await whenReady(cluster, 10_000);
  agent = buildApp(
    {
      store: new RedisDecisionStore(cluster, { timeoutMs: 2000 }),
      policies: new StaticPolicySource([ceiling]),
      shares: new StaticShareView({ ceiling: 0.5 }),
      log: pino({ level: 'silent' }),
      // Round-robin over the shards, so the test knows where every check lands.
      random: () => (draws++ % 4) / 4 + 0.01,
    },
    AgentConfig.parse({
      region: 'us',
      redisClusterNodes: nodes,
      policiesFile: 'unused',
      decisionDeadlineMs: 2000,
      storeTimeoutMs: 2000,
      reservationSweepMs: 0,
    }),
  );
  await agent.ready;
});
afterAll(async () => {
  await agent.app.close();
  cluster.disconnect();
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
});
