/**
 * Overload and the store breaker against a real Redis: caller errors and time queued in the agent never open
 * the breaker, admission control sheds explicitly before any store call, every admitted decision is answered
 * correctly however long it waited, and a call that Redis runs after the agent gave up on it charges nothing.
 */
import type { InjectOptions } from 'fastify';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse, Problem } from '../../../core/wire/agent.js';
import { bucketKey, idempotencyRecordKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { DEFAULT_DECISION_DEADLINE_MS } from '../../../regional-agent/config.js';
import type { RedisServer } from '../../harness/backend.js';
import { backend, uniquePrefix } from '../../harness/fixtures.js';
import { eventually } from '../../helpers/wait.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'closed', capacity: 100, refillPerSecond: 1 }),
  parsePolicy({ name: 'small', capacity: 5, refillPerSecond: 1, maxCost: 5 }),
];

/** An agent on `server`, its store's deadlines carried into the scripts by a Redis clock. */
async function startAgent(
  server: RedisServer,
  over: Record<string, unknown>,
): Promise<AgentFixture & { redis: Redis }> {
  const fixture = await agentFixture({
    policies,
    redis: { server },
    clock: { sampleEveryMs: 200 },
    config: {
      decisionDeadlineMs: DEFAULT_DECISION_DEADLINE_MS,
      breakerVolumeThreshold: 5,
      breakerResetMs: 300,
      trustedProxies: ['127.0.0.1'],
      // Tests that are not about the store timeout wait for slow replies on a busy machine.
      storeTimeoutMs: 2000,
      ...over,
    },
  });
  return fixture as AgentFixture & { redis: Redis };
}

const decide = (agent: AgentApp, payload: object) =>
  agent.app.inject({ method: 'POST', url: '/v1/decisions', payload });

let server: RedisServer;
beforeAll(async () => {
  server = await backend().startRedis();
});
afterAll(async () => {
  await server[Symbol.asyncDispose]();
});

describe('only Redis failures open the breaker', () => {
  it('costs below one micro-token are 400s at the edge and never count as store failures', async () => {
    await using a = await startAgent(server, {});
    const subject = uniquePrefix('tiny');
    for (let i = 0; i < 16; i++) {
      const r = await decide(a.agent, { policy: 'closed', subject, cost: 0.0000001 });
      expect(r.statusCode).toBe(400);
      expect(Problem.parse(r.json())).toMatchObject({ code: 'AGT_ERR_INVALID_COST' });
      const auth = await a.agent.app.inject({
        method: 'GET',
        url: '/v1/forward-auth?policy=closed&cost=0.0000001',
        headers: { 'x-quota-subject': subject },
      });
      expect(auth.statusCode).toBe(400);
      expect(Problem.parse(auth.json())).toMatchObject({ code: 'AGT_ERR_INVALID_QUERY' });
    }
    expect(a.agent.guard.state).toBe('closed');
    const ok = DecisionResponse.parse((await decide(a.agent, { policy: 'closed', subject })).json());
    expect(ok).toMatchObject({ allowed: true, results: [{ remaining: 99 }] });
    expect(ok.results[0]!.reason).toBeUndefined();
    expect(await a.redis.exists(bucketKey(1, subject, 'closed'))).toBe(1);
  });

  it('time queued in the agent never counts: a blocked event loop with a healthy Redis opens nothing', async () => {
    // 200 ms, not the production 50: on a loaded CI machine (load average above 20 on two cores) a healthy
    // Redis waited for a core longer than 50 ms before it ran a call, which the script then truly refused as
    // past its deadline (64 store_unavailable answers). What this test is about is this process's own delay:
    // it blocks for six store timeouts, whatever the timeout.
    const storeTimeoutMs = 200;
    await using a = await startAgent(server, { storeTimeoutMs });
    const prefix = uniquePrefix('queued');
    const pending = Array.from({ length: 200 }, (_, i) =>
      decide(a.agent, { policy: 'closed', subject: `${prefix}-${i % 50}` }),
    );
    // Hold the event loop six store timeouts long while the calls are on the wire: their replies arrive at the
    // socket in time and wait for us, so none may be counted as late.
    const written = performance.now() + 5000;
    while (a.redis.commandQueue.length === 0 && performance.now() < written) {
      await new Promise((r) => setImmediate(r));
    }
    expect(a.redis.commandQueue.length).toBeGreaterThan(0);
    const until = performance.now() + 6 * storeTimeoutMs;
    while (performance.now() < until) {
      // busy: this process is the slow part, not Redis
    }
    const answers = (await Promise.all(pending)).map((r) => DecisionResponse.parse(r.json()));
    expect(answers.filter((d) => d.results[0]!.reason !== undefined).map((d) => d.results[0])).toEqual([]);
    expect(answers.filter((d) => d.allowed)).toHaveLength(200);
    expect(a.agent.guard.status).toMatchObject({ state: 'closed', cause: null });
    expect(
      await a.metric(/quotaplane_store_latency_seconds_count\{operation="decide",outcome="timeout"\} (\d+)/),
    ).toBe(0);
  });

  it('a frozen Redis still opens it, within the store timeout, and /readyz names the cause', async () => {
    await using a = await startAgent(server, { storeTimeoutMs: 50 });
    await server.pause();
    try {
      const started = performance.now();
      for (let i = 0; i < 6; i++) {
        const d = DecisionResponse.parse(
          (await decide(a.agent, { policy: 'closed', subject: 'frozen' })).json(),
        );
        expect(d.results[0]).toMatchObject({ allowed: false, reason: 'store_unavailable' });
      }
      expect(performance.now() - started).toBeLessThan(6 * 250);
      expect(a.agent.guard.state).not.toBe('closed');
      const ready = await a.agent.app.inject({ method: 'GET', url: '/readyz' });
      // An open breaker is shown, not a reason to take the agent out of rotation: every agent of the region
      // shares that Redis, and the policies' failure modes answer meanwhile.
      expect(ready.statusCode).toBe(200);
      expect(ready.json()).toMatchObject({
        store: 'open',
        storeBreaker: { state: 'open', cause: { kind: 'timeout' } },
      });
    } finally {
      await server.resume();
    }
  });
});

describe('no charge after refusal', () => {
  it('calls queued in a frozen Redis, answered unavailable, change nothing when Redis resumes', async () => {
    await using a = await startAgent(server, { storeTimeoutMs: 50, breakerVolumeThreshold: 1000 });
    const subject = uniquePrefix('late');
    await server.pause();
    try {
      const answers = await Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          decide(a.agent, { policy: 'small', subject, idempotencyKey: `k${i}` }),
        ),
      );
      for (const r of answers) {
        expect(DecisionResponse.parse(r.json()).results[0]).toMatchObject({
          allowed: false,
          reason: 'store_unavailable',
        });
      }
    } finally {
      await server.resume();
    }
    // Redis now runs the eight queued scripts, each past its deadline: the bucket and the records stay absent.
    await a.redis.ping();
    expect(await a.redis.exists(bucketKey(1, subject, 'small'))).toBe(0);
    for (let i = 0; i < 8; i++) expect(await a.redis.exists(idempotencyRecordKey(subject, `k${i}`))).toBe(0);
    const fresh = DecisionResponse.parse((await decide(a.agent, { policy: 'small', subject })).json());
    expect(fresh).toMatchObject({ allowed: true, results: [{ remaining: 4 }] });
  });
});

describe('admission control', () => {
  it('sheds beyond the in-flight bound with 503 AGT_ERR_OVERLOADED and Retry-After; the admitted ones are decided once Redis answers', async () => {
    await using a = await startAgent(server, {
      maxInFlight: 4,
      storeTimeoutMs: 5000,
      overloadRetryAfterMs: 1500,
    });
    const subject = uniquePrefix('crowd');
    await server.pause();
    let answers: Awaited<ReturnType<typeof decide>>[];
    try {
      const pending = Array.from({ length: 7 }, () => decide(a.agent, { policy: 'small', subject }));
      // The four admitted ones wait on the frozen Redis; the three others are answered at once.
      await eventually(() => a.agent.admission.inFlight >= 4, 5000, '4 requests admitted', 5);
      expect(a.agent.admission.inFlight).toBe(4);
      const auth = await a.agent.app.inject({
        method: 'GET',
        url: '/v1/forward-auth?policy=small',
        headers: { 'x-quota-subject': subject },
      });
      expect(auth.statusCode).toBe(503);
      expect(auth.headers['retry-after']).toBe('2');
      expect(Problem.parse(auth.json())).toMatchObject({ code: 'AGT_ERR_OVERLOADED' });
      await server.resume();
      answers = await Promise.all(pending);
    } finally {
      await server.resume();
    }
    const shed = answers.filter((r) => r.statusCode === 503);
    expect(shed).toHaveLength(3);
    for (const r of shed) {
      expect(r.headers['retry-after']).toBe('2');
      expect(r.headers['content-type']).toContain('application/problem+json');
      expect(Problem.parse(r.json())).toMatchObject({ status: 503, code: 'AGT_ERR_OVERLOADED' });
    }
    const decided = answers.filter((r) => r.statusCode === 200).map((r) => DecisionResponse.parse(r.json()));
    expect(decided.map((d) => d.allowed)).toEqual([true, true, true, true]);
    expect(decided.map((d) => d.results[0]!.remaining).sort()).toEqual([1, 2, 3, 4]);
    expect(
      await a.metric(
        /quotaplane_shed_decisions_total\{region="us",route="http",reason="overloaded",cause="in_flight"\} (\d+)/,
      ),
    ).toBe(3);
    expect(
      await a.metric(
        /quotaplane_shed_decisions_total\{region="us",route="forward_auth",reason="overloaded",cause="in_flight"\} (\d+)/,
      ),
    ).toBe(1);
    expect(a.agent.admission.inFlight).toBe(0);
    expect(a.agent.guard.state).toBe('closed');
  });
});

describe('admission control covers every route that reaches the store', () => {
  it('reservations, their settlement, lease releases, explain and gRPC are shed like decisions, and change nothing', async () => {
    await using a = await startAgent(server, {
      maxInFlight: 2,
      storeTimeoutMs: 5000,
      overloadRetryAfterMs: 1000,
    });
    const subject = uniquePrefix('holes');
    const key = bucketKey(1, subject, 'small');
    await server.pause();
    let held: Awaited<ReturnType<typeof decide>>[];
    const answers: { route: string; status: number; code: unknown }[] = [];
    let grpc: unknown;
    try {
      // Two reservations fill the bound: a reservation is admitted like a decision.
      const pending = [1, 2].map(() =>
        a.agent.app.inject({
          method: 'POST',
          url: '/v1/reservations',
          payload: { policy: 'small', subject, amount: 1 },
        }),
      );
      await eventually(() => a.agent.admission.inFlight >= 2, 5000, '2 requests admitted', 5);
      expect(a.agent.admission.inFlight).toBe(2);
      const tries: [string, InjectOptions][] = [
        ['http', { method: 'POST', url: '/v1/decisions', payload: { policy: 'small', subject } }],
        [
          'reservations',
          { method: 'POST', url: '/v1/reservations', payload: { policy: 'small', subject, amount: 1 } },
        ],
        ['reservations', { method: 'POST', url: '/v1/reservations/r1.abc/commit', payload: { amount: 1 } }],
        ['reservations', { method: 'DELETE', url: '/v1/reservations/r1.abc' }],
        ['leases', { method: 'DELETE', url: '/v1/leases/l2.abc.def' }],
        ['explain', { method: 'GET', url: `/v1/explain?policy=small&subject=${subject}` }],
      ];
      for (const [route, request] of tries) {
        const res = await a.agent.app.inject(request);
        answers.push({ route, status: res.statusCode, code: res.json<{ code?: unknown }>().code });
      }
      grpc = await a.agent.rls
        .shouldRateLimit(
          { domain: 'quotaplane', descriptors: [{ entries: [{ key: 'policy', value: 'small' }] }] },
          1000,
        )
        .then(
          () => 'decided',
          (error: unknown) => error,
        );
      // Health, readiness and metrics still answer while the agent sheds.
      expect((await a.agent.app.inject({ method: 'GET', url: '/healthz' })).statusCode).toBe(200);
      await server.resume();
      held = await Promise.all(pending);
    } finally {
      await server.resume();
    }
    expect(answers).toEqual(
      ['http', 'reservations', 'reservations', 'reservations', 'leases', 'explain'].map((route) => ({
        route,
        status: 503,
        code: 'AGT_ERR_OVERLOADED',
      })),
    );
    expect(grpc).toMatchObject({ name: 'RlsError', status: 'UNAVAILABLE', code: 'AGT_ERR_OVERLOADED' });
    expect(held.map((r) => r.statusCode)).toEqual([200, 200]);
    // Only the two admitted reservations charged the bucket: 5 - 2 tokens left.
    expect(Number(await a.redis.hget(key, 'tk'))).toBeGreaterThanOrEqual(3_000_000);
    expect(Number(await a.redis.hget(key, 'tk'))).toBeLessThan(4_000_000);
    for (const [route, shed] of [
      ['http', 1],
      ['reservations', 3],
      ['leases', 1],
      ['explain', 1],
      ['grpc', 1],
    ] as const) {
      expect(
        await a.metric(
          new RegExp(
            `quotaplane_shed_decisions_total\\{region="us",route="${route}",reason="overloaded",cause="in_flight"\\} (\\d+)`,
          ),
        ),
        route,
      ).toBe(shed);
    }
    expect(a.agent.admission.inFlight).toBe(0);
  });
});

describe('idempotency keeps admissions only', () => {
  it('a refused decision retried with the same key after Retry-After gets a fresh answer', async () => {
    await using a = await startAgent(server, {});
    const subject = uniquePrefix('retry');
    const first = DecisionResponse.parse(
      (await decide(a.agent, { policy: 'small', subject, cost: 5 })).json(),
    );
    expect(first.allowed).toBe(true);
    const refusedAt = performance.now();
    const refused = DecisionResponse.parse(
      (await decide(a.agent, { policy: 'small', subject, idempotencyKey: 'op-1' })).json(),
    );
    expect(refused.allowed).toBe(false);
    expect(refused.retryAfterMs).toBeGreaterThan(0);
    expect(refused.retryAfterMs).toBeLessThanOrEqual(1000);
    expect(await a.redis.exists(idempotencyRecordKey(subject, 'op-1'))).toBe(0);
    // Retries with the same key are decided afresh: refused until the bucket refilled one token, which the hint
    // said would take retryAfterMs (rounded up to a whole ms, so the token may come up to 1 ms sooner).
    let retried = refused;
    await eventually(
      async () => {
        retried = DecisionResponse.parse(
          (await decide(a.agent, { policy: 'small', subject, idempotencyKey: 'op-1' })).json(),
        );
        return retried.allowed;
      },
      refused.retryAfterMs! + 5000,
      'a retry with the same key is admitted',
    );
    expect(performance.now() - refusedAt).toBeGreaterThanOrEqual(refused.retryAfterMs! - 1);
    expect(retried.replayed).toBeUndefined();
    const replay = DecisionResponse.parse(
      (await decide(a.agent, { policy: 'small', subject, idempotencyKey: 'op-1' })).json(),
    );
    expect(replay).toMatchObject({ allowed: true, replayed: true });
  });
});
