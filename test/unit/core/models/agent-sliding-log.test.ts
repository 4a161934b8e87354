import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy, PolicySpec } from '../../../../core/policy/policy.js';
import { StaticShareView, type RegionalShare, type ShareView } from '../../../../core/shares/shares.js';
import { sizedLog, slidingLogKey } from '../../../../core/models/sliding-log.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';

const policies = [
  parsePolicy({ name: 'guesses', kind: 'sliding_log', capacity: 5, windowSeconds: 600 }),
  parsePolicy({ name: 'bulk', kind: 'sliding_log', capacity: 10, windowSeconds: 60, maxCost: 4 }),
  parsePolicy({
    name: 'guesses-open',
    kind: 'sliding_log',
    capacity: 1,
    windowSeconds: 60,
    onStoreFailure: 'open',
  }),
  parsePolicy({ name: 'rate', capacity: 3, refillPerSecond: 1e-4, maxCost: 3 }),
  parsePolicy({ name: 'log11', kind: 'sliding_log', capacity: 11, windowSeconds: 60 }),
  parsePolicy({ name: 'day11', kind: 'daily', capacity: 11 }),
  parsePolicy({ name: 'rate-tenth', capacity: 3, refillPerSecond: 0.1 }),
];

function agent(shares: ShareView = new StaticShareView()) {
  const clock = new ManualClock(1_750_000_000_000);
  const store = new ModelDecisionStore(clock);
  const built = buildApp(
    {
      store,
      policies: new StaticPolicySource(policies),
      shares,
      log: pino({ level: 'silent' }),
      clock,
      random: () => 1,
    },
    AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' }),
  );
  const post = async (body: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
    return { status: res.statusCode, body: res.json<Record<string, unknown>>(), headers: res.headers };
  };
  const decision = async (body: object) => {
    const r = await post(body);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    return DecisionResponse.parse(r.body);
  };
  const app = async () => {
    await built.ready;
    return built;
  };
  return { clock, store, post, decision, built: app };
}

describe('sliding-log policies: the schema', () => {
  it('defaults keep token buckets; a sliding log derives its rate and idle TTL from its window', () => {
    expect(parsePolicy({ name: 'a', capacity: 10, refillPerSecond: 1 }).kind).toBe('token_bucket');
    expect(policies[0]).toMatchObject({
      kind: 'sliding_log',
      capacity: 5,
      windowSeconds: 600,
      refillPerSecond: 5 / 600,
      idleTtlSeconds: 600,
      maxCost: 1,
    });
  });

  it('refuses what a sliding log cannot mean, listing every problem', () => {
    const r = PolicySpec.safeParse({
      kind: 'sliding_log',
      capacity: 2.5,
      maxCost: 1.5,
      refillPerSecond: 3,
      onStoreFailure: 'local',
      windowSeconds: 60,
      idleTtlSeconds: 30,
    });
    expect(r.success).toBe(false);
    expect(r.error?.issues.map((i) => i.path.join('.')).sort()).toEqual([
      'capacity',
      'idleTtlSeconds',
      'maxCost',
      'onStoreFailure',
      'refillPerSecond',
    ]);
    expect(PolicySpec.safeParse({ kind: 'sliding_log', capacity: 5 }).error?.issues[0]?.path).toEqual([
      'windowSeconds',
    ]);
    expect(
      PolicySpec.safeParse({ capacity: 5, windowSeconds: 60 }).error?.issues.map((i) => i.path[0]),
    ).toEqual(['windowSeconds', 'refillPerSecond']);
    // Echoing the derived rate back (as GET returns it) is accepted.
    expect(
      PolicySpec.safeParse({ kind: 'sliding_log', capacity: 5, windowSeconds: 600, refillPerSecond: 5 / 600 })
        .success,
    ).toBe(true);
  });
});

describe('sliding-log policies on the agent', () => {
  it('five guesses in any rolling 10 minutes: the sixth waits for the first to leave', async () => {
    const { clock, decision, built } = agent();
    for (let i = 0; i < 5; i++) {
      const d = await decision({ policy: 'guesses', subject: 'acct-1' });
      expect(d.results[0]).toMatchObject({ allowed: true, remaining: 4 - i, limit: 5 });
      clock.advance(60_000);
    }
    const denied = await decision({ policy: 'guesses', subject: 'acct-1' });
    expect(denied.allowed).toBe(false);
    // The log holds the subject's whole budget (share 1): what one global log would refuse too.
    expect(denied.results[0]!.reason).toBe('subject_exhausted');
    // The first guess (5 minutes ago) leaves the window in 300 s.
    expect(denied.retryAfterMs).toBe(300_000);
    expect(denied.headers['Retry-After']).toBe('300');
    expect(denied.headers['RateLimit-Policy']).toBe('"guesses";q=5;w=600');
    clock.advance(300_000);
    expect((await decision({ policy: 'guesses', subject: 'acct-1' })).allowed).toBe(true);
    const metrics = await (await built()).app.inject({ method: 'GET', url: '/metrics' });
    expect(metrics.body).toContain(
      'quotaplane_decisions_by_kind_total{kind="sliding_log",decision="allowed"} 6',
    );
    expect(metrics.body).toContain(
      'quotaplane_decisions_by_kind_total{kind="sliding_log",decision="denied"} 1',
    );
    expect((await decision({ policy: 'guesses', subject: 'acct-2' })).results[0]?.remaining).toBe(4);
  });

  it('layered with a token bucket, all-or-nothing: a denial of the rate takes the logged entry back', async () => {
    const { store, clock, decision } = agent();
    const body = {
      checks: [
        { policy: 'bulk', subject: 's', cost: 2 },
        { policy: 'rate', subject: 's', cost: 2 },
      ],
    };
    const first = await decision(body);
    expect(first.allowed).toBe(true);
    expect(first.results.map((r) => r.remaining)).toEqual([8, 1]);
    const key = slidingLogKey(1, 's', 'bulk');
    const now = () => Math.round(clock.now() * 1000);
    expect(store.logs.entries(key, now())).toHaveLength(2);
    const second = await decision(body);
    expect(second.allowed).toBe(false);
    // The log admitted and was refunded: it holds the first call's 2 entries only, and says so.
    expect(store.logs.entries(key, now())).toHaveLength(2);
    expect(second.results.map((r) => r.remaining)).toEqual([8, 1]);
    // And the other way round: a full log writes nothing and charges no tokens.
    const logFirst = {
      checks: [
        { policy: 'rate', subject: 's', cost: 1 },
        { policy: 'bulk', subject: 's', cost: 4 },
      ],
    };
    await decision({ policy: 'bulk', subject: 's', cost: 4 });
    await decision({ policy: 'bulk', subject: 's', cost: 4 });
    const third = await decision(logFirst);
    expect(third.allowed).toBe(false);
    expect(third.results.map((r) => r.remaining)).toEqual([1, 0]);
    // Only the check without room says why; the rate had room.
    expect(third.results.map((r) => r.reason)).toEqual([undefined, 'subject_exhausted']);
    expect(store.logs.entries(key, now())).toHaveLength(10);
  });

  it("RateLimit-Policy says each kind's own window: w=windowSeconds, w=86400, w=capacity / refill", async () => {
    const { decision } = agent();
    // capacity / (capacity / window) is not the window in floating point for these capacities (11 / (11 / 60) is
    // 60.00000000000001): rounded up, it said w=61, w=86401 and w=31.
    const d = await decision({
      checks: [
        { policy: 'log11', subject: 'acct-w' },
        { policy: 'day11', subject: 'acct-w' },
        { policy: 'rate-tenth', subject: 'acct-w' },
      ],
    });
    expect(d.allowed).toBe(true);
    expect(d.headers['RateLimit-Policy']).toBe(
      '"log11";q=11;w=60, "day11";q=11;w=86400, "rate-tenth";q=3;w=30',
    );
  });

  it('a check refunded after a later denial says when its own bucket or log is full again: now, once whole', async () => {
    const { decision } = agent();
    // The rate denies: the log's entries go back, and the log, empty again, is whole now.
    await decision({ policy: 'rate', subject: 'reset-1', cost: 3 });
    const logBack = await decision({
      checks: [
        { policy: 'bulk', subject: 'reset-1', cost: 2 },
        { policy: 'rate', subject: 'reset-1', cost: 1 },
      ],
    });
    expect(logBack.allowed).toBe(false);
    expect(logBack.results[0]).toMatchObject({ remaining: 10, resetMs: 0 });
    expect(logBack.headers['RateLimit']).toMatch(/^"bulk";r=10;t=0, /);
    // The log denies: the token bucket's token goes back, and the bucket is full again.
    await decision({ policy: 'bulk', subject: 'reset-2', cost: 4 });
    await decision({ policy: 'bulk', subject: 'reset-2', cost: 4 });
    const tokensBack = await decision({
      checks: [
        { policy: 'rate', subject: 'reset-2', cost: 1 },
        { policy: 'bulk', subject: 'reset-2', cost: 4 },
      ],
    });
    expect(tokensBack.allowed).toBe(false);
    // Before, the refunded checks kept the reset of their charged state: 60 s for the empty log, and 10,000 s (one
    // token at 1e-4 a second) for the full bucket, in resetMs and in RateLimit's t.
    expect(tokensBack.results[0]).toMatchObject({ remaining: 3, resetMs: 0 });
    expect(tokensBack.headers['RateLimit']).toMatch(/^"rate";r=3;t=0, /);
  });

  it('idempotent retries replay and write nothing', async () => {
    const { store, clock, decision } = agent();
    const body = { policy: 'bulk', subject: 'idem', cost: 3, idempotencyKey: 'job-1' };
    const a = await decision(body);
    const b = await decision(body);
    expect([a.allowed, b.allowed, b.replayed]).toEqual([true, true, true]);
    expect(store.logs.entries(slidingLogKey(1, 'idem', 'bulk'), Math.round(clock.now() * 1000))).toHaveLength(
      3,
    );
  });

  it('bad input changes nothing: a fractional cost is AGT_ERR_INVALID_COST', async () => {
    const { store, clock, post } = agent();
    const r = await post({ policy: 'bulk', subject: 'frac', cost: 1.5 });
    expect(r.status).toBe(400);
    expect(r.body['code']).toBe('AGT_ERR_INVALID_COST');
    expect(store.logs.entries(slidingLogKey(1, 'frac', 'bulk'), Math.round(clock.now() * 1000))).toHaveLength(
      0,
    );
  });

  it('a region enforces floor(limit × the lowest share in force over the window)', async () => {
    const table: Record<string, RegionalShare> = {
      bulk: { share: 0.7, epoch: 2, lowest: 0.35 },
      guesses: { share: 0.5, epoch: 1 },
    };
    const shares: ShareView = { shareFor: (p) => table[p], enter: () => () => undefined };
    const { decision } = agent(shares);
    expect((await decision({ policy: 'bulk', subject: 'x' })).results[0]?.limit).toBe(3);
    expect((await decision({ policy: 'guesses', subject: 'x' })).results[0]?.limit).toBe(2);
    // A part of the budget: its refusal says the rest, in other regions, may be left.
    await decision({ policy: 'guesses', subject: 'x' });
    const refused = await decision({ policy: 'guesses', subject: 'x' });
    expect(refused.results[0]).toMatchObject({ allowed: false, limit: 2, reason: 'share_exhausted' });
    // Summed over regions, floors never exceed the limit; 100 × 0.29 is 29, not 28.
    expect(sizedLog({ capacity: 100, windowSeconds: 60, idleTtlSeconds: 60 }, 'k', 1, 0.29).limit).toBe(29);
    const split = [0.33, 0.33, 0.34].map(
      (s) => sizedLog({ capacity: 5, windowSeconds: 60, idleTtlSeconds: 60 }, 'k', 1, s).limit,
    );
    expect(split).toEqual([1, 1, 1]);
  });

  it('a store failure takes the policy failure mode: closed denies, open admits, both counted', async () => {
    const { store, decision } = agent();
    store.decideLog = () => Promise.reject(new Error('ECONNREFUSED'));
    const closed = await decision({ policy: 'guesses', subject: 'f' });
    expect(closed.results[0]).toMatchObject({ allowed: false, reason: 'store_unavailable', limit: 5 });
    const open = await decision({ policy: 'guesses-open', subject: 'f' });
    expect(open.results[0]).toMatchObject({ allowed: true, reason: 'fail_open' });
  });
});
