import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { bucketKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp, type AgentApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';
import { connectRedis, whenReady } from '../../../regional-agent/redis/connect.js';
import { RedisDecisionStore } from '../../../regional-agent/redis/decision-store.js';
import { uniquePrefix } from '../../harness/fixtures.js';

// Refill is negligible during a test (1e-5 token/s), so every number below is exact to 1e-3.
const policies = [
  parsePolicy({ name: 'account', capacity: 10, refillPerSecond: 1e-5, maxCost: 10 }),
  parsePolicy({ name: 'ceiling', capacity: 5, refillPerSecond: 1e-5, maxCost: 5 }),
];

let cluster: Cluster;
let agent: AgentApp;

beforeAll(async () => {
  const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
  cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
  cluster.on('error', () => undefined);
  await whenReady(cluster, 10_000);
  agent = buildApp(
    {
      store: new RedisDecisionStore(cluster, { timeoutMs: 2000 }),
      policies: new StaticPolicySource(policies),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
    },
    AgentConfig.parse({
      region: 'us',
      redisClusterNodes: nodes,
      policiesFile: 'unused',
      decisionDeadlineMs: 2000,
      storeTimeoutMs: 2000,
    }),
  );
  await agent.ready;
});
afterAll(async () => {
  await agent.app.close();
  cluster.disconnect();
});

/** An account subject and a ceiling subject whose buckets live in different cluster slots. */
function apart(): { account: string; ceiling: string } {
  const ceiling = uniquePrefix('global');
  let account = uniquePrefix('acct');
  while (
    calculateSlot(bucketKey(1, account, 'account')) === calculateSlot(bucketKey(1, ceiling, 'ceiling'))
  ) {
    account = uniquePrefix('acct');
  }
  return { account, ceiling };
}

async function tokens(subject: string, policy: string): Promise<number | null> {
  const tk = await cluster.hget(bucketKey(1, subject, policy), 'tk');
  return tk === null ? null : Number(tk) / 1e6;
}

async function decide(body: unknown) {
  const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body as object });
  return res;
}

describe('layered checks across cluster slots (real 3-master cluster)', () => {
  it('refunds the earlier slot when a later slot denies: no grant survives', async () => {
    const { account, ceiling } = apart();
    const body = {
      checks: [
        { policy: 'account', subject: account },
        { policy: 'ceiling', subject: ceiling, cost: 2 },
      ],
    };
    const outcomes: boolean[] = [];
    for (let i = 0; i < 4; i++) outcomes.push(DecisionResponse.parse((await decide(body)).json()).allowed);
    expect(outcomes).toEqual([true, true, false, false]);
    expect(await tokens(account, 'account')).toBeCloseTo(8, 3);
    expect(await tokens(ceiling, 'ceiling')).toBeCloseTo(1, 3);
    const last = DecisionResponse.parse((await decide(body)).json());
    expect(last.allowed).toBe(false);
    expect(last.results.map((r) => r.allowed)).toEqual([false, false]);
    expect(last.results[0]!.remaining).toBeCloseTo(8, 3);
    expect(last.results[1]!.retryAfterMs).toBeGreaterThan(0);
    const metrics = (await agent.app.inject({ method: 'GET', url: '/metrics' })).body;
    expect(metrics).toMatch(/quotaplane_refunds_total\{outcome="ok"\} [1-9]/);
  });

  it('60 racing requests against a ceiling of 5: exactly 5 admitted, every other account bucket made whole', async () => {
    const ceiling = uniquePrefix('global');
    const accounts: string[] = [];
    while (accounts.length < 60) {
      const a = uniquePrefix('acct');
      if (calculateSlot(bucketKey(1, a, 'account')) !== calculateSlot(bucketKey(1, ceiling, 'ceiling')))
        accounts.push(a);
    }
    const responses = await Promise.all(
      accounts.map((account) =>
        decide({
          checks: [
            { policy: 'account', subject: account, cost: 3 },
            { policy: 'ceiling', subject: ceiling },
          ],
        }),
      ),
    );
    const allowed = responses.map((r) => DecisionResponse.parse(r.json()).allowed);
    expect(allowed.filter(Boolean)).toHaveLength(5);
    const held = await Promise.all(accounts.map((a) => tokens(a, 'account')));
    for (let i = 0; i < accounts.length; i++) {
      expect(held[i], `account ${i} (${allowed[i] ? 'admitted' : 'denied'})`).toBeCloseTo(
        allowed[i] ? 7 : 10,
        3,
      );
    }
    expect(await tokens(ceiling, 'ceiling')).toBeCloseTo(0, 3);
  });

  it('a denial in the first slot charges nothing anywhere, and reports what the later slot holds', async () => {
    const { account, ceiling } = apart();
    await decide({ checks: [{ policy: 'ceiling', subject: ceiling, cost: 5 }] });
    const denied = DecisionResponse.parse(
      (
        await decide({
          checks: [
            { policy: 'ceiling', subject: ceiling },
            { policy: 'account', subject: account, cost: 3 },
          ],
        })
      ).json(),
    );
    expect(denied.allowed).toBe(false);
    expect(denied.results[1]!.remaining).toBeCloseTo(10, 3);
    expect(denied.results[1]!.retryAfterMs).toBe(0);
    expect(await tokens(account, 'account')).toBeNull();
  });

  it('idempotency across slots: a retry replays and charges nothing; the key on another request is a 409', async () => {
    const { account, ceiling } = apart();
    const body = {
      checks: [
        { policy: 'account', subject: account, cost: 2 },
        { policy: 'ceiling', subject: ceiling },
      ],
      idempotencyKey: 'export-7',
    };
    const first = DecisionResponse.parse((await decide(body)).json());
    const retry = DecisionResponse.parse((await decide(body)).json());
    expect(first.allowed).toBe(true);
    expect(retry.allowed).toBe(true);
    expect(retry.replayed).toBe(true);
    expect(await tokens(account, 'account')).toBeCloseTo(8, 3);
    expect(await tokens(ceiling, 'ceiling')).toBeCloseTo(4, 3);
    const other = await decide({
      ...body,
      checks: [{ policy: 'account', subject: account, cost: 1 }, body.checks[1]],
    });
    expect(other.statusCode).toBe(409);
    expect(other.json()).toMatchObject({ code: 'AGT_ERR_IDEMPOTENCY_CONFLICT' });
    expect(await tokens(account, 'account')).toBeCloseTo(8, 3);
    expect(await tokens(ceiling, 'ceiling')).toBeCloseTo(4, 3);
  });

  it('one key on a one-group and a several-group request is a 409 in either order, charging nothing', async () => {
    // The one-group request first: its record is on the plain key the several-group request's claim marks.
    const first = apart();
    const single = { policy: 'account', subject: first.account, cost: 2, idempotencyKey: 'mix-1' };
    const layered = {
      checks: [
        { policy: 'account', subject: first.account, cost: 2 },
        { policy: 'ceiling', subject: first.ceiling },
      ],
      idempotencyKey: 'mix-1',
    };
    expect(DecisionResponse.parse((await decide(single)).json()).allowed).toBe(true);
    const late = await decide(layered);
    expect(late.statusCode).toBe(409);
    expect(late.json()).toMatchObject({ code: 'AGT_ERR_IDEMPOTENCY_CONFLICT' });
    expect(await tokens(first.account, 'account')).toBeCloseTo(8, 3);
    expect(await tokens(first.ceiling, 'ceiling')).toBeNull();

    // The several-group request first: a one-group request of either of its groups' subjects finds its mark.
    const second = apart();
    const body = {
      checks: [
        { policy: 'account', subject: second.account, cost: 2 },
        { policy: 'ceiling', subject: second.ceiling },
      ],
      idempotencyKey: 'mix-2',
    };
    expect(DecisionResponse.parse((await decide(body)).json()).allowed).toBe(true);
    for (const check of body.checks) {
      const other = await decide({ ...check, idempotencyKey: 'mix-2' });
      expect(other.statusCode).toBe(409);
      expect(other.json()).toMatchObject({ code: 'AGT_ERR_IDEMPOTENCY_CONFLICT' });
    }
    const retry = DecisionResponse.parse((await decide(body)).json());
    expect(retry.replayed).toBe(true);
    expect(await tokens(second.account, 'account')).toBeCloseTo(8, 3);
    expect(await tokens(second.ceiling, 'ceiling')).toBeCloseTo(4, 3);
  });

  it('racing a one-group and a several-group request of one key: one is decided, the other is a 409', async () => {
    for (let round = 0; round < 6; round++) {
      const { account, ceiling } = apart();
      const key = `race-${round}`;
      const layered = {
        checks: [
          { policy: 'account', subject: account, cost: 2 },
          { policy: 'ceiling', subject: ceiling },
        ],
        idempotencyKey: key,
      };
      const single = { policy: 'account', subject: account, cost: 2, idempotencyKey: key };
      // Either may reach Redis first; alternate which is sent first.
      const sent = round % 2 === 0 ? [decide(layered), decide(single)] : [decide(single), decide(layered)];
      const statuses = (await Promise.all(sent)).map((r) => r.statusCode).sort();
      expect(statuses).toEqual([200, 409]);
      // Whichever was decided charged its 2 tokens once; the other charged nothing.
      expect(await tokens(account, 'account')).toBeCloseTo(8, 3);
    }
  });

  it('a retried denial stays denied and leaves no grant behind', async () => {
    const { account, ceiling } = apart();
    await decide({ checks: [{ policy: 'ceiling', subject: ceiling, cost: 5 }] });
    const body = {
      checks: [
        { policy: 'account', subject: account, cost: 4 },
        { policy: 'ceiling', subject: ceiling },
      ],
      idempotencyKey: 'retry-me',
    };
    for (let i = 0; i < 3; i++) {
      const r = DecisionResponse.parse((await decide(body)).json());
      expect(r.allowed).toBe(false);
      expect(await tokens(account, 'account')).toBeCloseTo(10, 3);
    }
  });
});
