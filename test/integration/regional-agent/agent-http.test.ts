import type { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse, Problem } from '../../../core/wire/agent.js';
import { bucketKey, idempotencyRecordKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { uniquePrefix } from '../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'writes', capacity: 3, refillPerSecond: 0.001, idleTtlSeconds: 3600 }),
  parsePolicy({ name: 'reports', capacity: 100, refillPerSecond: 1, maxCost: 10 }),
  parsePolicy({ name: 'halved', capacity: 10, refillPerSecond: 1, maxCost: 5 }),
  parsePolicy({ name: 'shared', capacity: 288, refillPerSecond: 0.001, maxCost: 2, idleTtlSeconds: 300_000 }),
];

let redis: Redis | Cluster;
let agent: AgentApp;
let legacy: AgentApp;
let fixtures: AgentFixture[] = [];

async function decide(body: unknown, app = agent) {
  const res = await app.app.inject({ method: 'POST', url: '/v1/decisions', payload: body as object });
  return res;
}

function problemOf(res: { statusCode: number; headers: Record<string, unknown>; body: string }) {
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  return Problem.parse(JSON.parse(res.body));
}

// Every test runs on one Redis and again on a Redis Cluster (issue 7: any region may use a cluster).
describe.each(['redis', 'cluster'] as const)('agent HTTP API on %s', (backend) => {
  beforeAll(async () => {
    const options = {
      policies,
      shares: { halved: 0.5, shared: 0.6 },
      redis: backend === 'cluster' ? ('cluster' as const) : ('shared' as const),
    };
    const config = { decisionDeadlineMs: 500, storeTimeoutMs: 500 };
    const first = await agentFixture({ ...options, config: { ...config, trustedProxies: ['127.0.0.1'] } });
    const second = await agentFixture({
      ...options,
      redis: { client: first.redis },
      config: { ...config, legacyHeaders: true },
    });
    fixtures = [second, first];
    ({ agent, redis } = first);
    legacy = second.agent;
  });
  afterAll(async () => {
    for (const f of fixtures) await f[Symbol.asyncDispose]();
  });

  describe('POST /v1/decisions', () => {
    it('answers a single check with exact numbers and the draft-10 headers', async () => {
      const subject = uniquePrefix('tenant');
      const first = await decide({ policy: 'writes', subject });
      expect(first.statusCode).toBe(200);
      const body = DecisionResponse.parse(first.json());
      expect(body.allowed).toBe(true);
      expect(body.results).toEqual([
        {
          policy: 'writes',
          allowed: true,
          remaining: 2,
          limit: 3,
          resetMs: 1_000_000,
          retryAfterMs: 0,
          mode: 'regional',
        },
      ]);
      expect(body.headers).toEqual({
        'RateLimit-Policy': '"writes";q=3;w=3000',
        RateLimit: '"writes";r=2;t=1000',
      });
      expect(first.headers['x-request-id']).toBeTruthy();
    });

    it('answers whole tokens: remaining and limit floored, as in the headers, without float noise', async () => {
      const subject = uniquePrefix('tenant');
      // 288 × 0.6 is 172.79999999999998 in doubles; a cost of 0.41 leaves 172.38999999999998.
      const res = await decide({ policy: 'shared', subject, cost: 0.41 });
      expect(res.body).toMatch(/"remaining":172,"limit":172,/);
      const body = DecisionResponse.parse(res.json());
      expect(body.results[0]).toMatchObject({ remaining: 172, limit: 172 });
      expect(body.headers['RateLimit-Policy']).toBe('"shared";q=172;w=288000');
      expect(body.headers['RateLimit']).toMatch(/^"shared";r=172;t=\d+$/);
      const second = DecisionResponse.parse((await decide({ policy: 'shared', subject, cost: 2 })).json());
      expect(second.results[0]).toMatchObject({ remaining: 170, limit: 172 });
    });

    it('denies once the bucket is empty: Retry-After in whole seconds, t when the quota is whole (draft-11)', async () => {
      const subject = uniquePrefix('tenant');
      for (let i = 0; i < 3; i++)
        expect(DecisionResponse.parse((await decide({ policy: 'writes', subject })).json()).allowed).toBe(
          true,
        );
      const denied = DecisionResponse.parse((await decide({ policy: 'writes', subject })).json());
      expect(denied.allowed).toBe(false);
      expect(denied.retryAfterMs).toBeGreaterThan(999_000);
      expect(denied.retryAfterMs).toBeLessThanOrEqual(1_000_000);
      const retryAfter = Number(denied.headers['Retry-After']);
      expect(retryAfter).toBe(Math.ceil(denied.retryAfterMs! / 1000));
      const t = Number(/;t=(\d+)/.exec(denied.headers['RateLimit']!)![1]);
      // Empty: the quota is whole again after the window (3,000 s), well after the cost fits.
      expect(t).toBeGreaterThan(retryAfter);
      expect(t).toBeLessThanOrEqual(3000);
      expect(denied.headers['RateLimit']).toMatch(/^"writes";r=0;t=\d+$/);
    });

    it('decides layered checks all-or-nothing and sizes buckets by the static share', async () => {
      const subject = uniquePrefix('tenant');
      const ok = DecisionResponse.parse(
        (
          await decide({
            checks: [
              { policy: 'reports', subject, cost: 10 },
              { policy: 'halved', subject, cost: 5 },
            ],
          })
        ).json(),
      );
      expect(ok.allowed).toBe(true);
      expect(ok.results.map((r) => [r.remaining, r.limit])).toEqual([
        [90, 100],
        [0, 5],
      ]);
      const denied = DecisionResponse.parse(
        (
          await decide({
            checks: [
              { policy: 'reports', subject, cost: 10 },
              { policy: 'halved', subject, cost: 1 },
            ],
          })
        ).json(),
      );
      expect(denied.allowed).toBe(false);
      expect(denied.results.map((r) => r.allowed)).toEqual([false, false]);
      // Nothing was charged: reports still holds 90 (plus what refilled meanwhile, under one token).
      expect(denied.results[0]!.remaining).toBeGreaterThanOrEqual(90);
      expect(denied.results[0]!.remaining).toBeLessThan(91);
      expect(denied.results[0]!.retryAfterMs).toBe(0);
      expect(denied.results[1]!.retryAfterMs).toBeGreaterThan(0);
      // draft-11 lists every policy checked; Retry-After is when halved's cost fits.
      expect(denied.headers['RateLimit']).toMatch(/^"reports";r=90;t=\d+, "halved";r=0;t=10$/);
      expect(denied.headers['Retry-After']).toBe('2');
    });

    it('a dry run charges nothing', async () => {
      const subject = uniquePrefix('tenant');
      for (let i = 0; i < 3; i++) {
        const dry = DecisionResponse.parse(
          (await decide({ policy: 'writes', subject, dryRun: true })).json(),
        );
        expect(dry.results[0]!.remaining).toBe(2);
      }
      expect(await redis.exists(bucketKey(1, subject, 'writes'))).toBe(0);
    });

    it('a retry with the same idempotency key replays the first decision and charges nothing', async () => {
      const subject = uniquePrefix('tenant');
      const body = { policy: 'writes', subject, idempotencyKey: 'order-42' };
      const first = DecisionResponse.parse((await decide(body)).json());
      const again = DecisionResponse.parse((await decide(body)).json());
      expect(again.replayed).toBe(true);
      expect(again.results).toEqual(first.results);
      expect(Number(await redis.hget(bucketKey(1, subject, 'writes'), 'tk'))).toBe(2_000_000);
      const conflict = await decide({ ...body, policy: 'reports' });
      expect(conflict.statusCode).toBe(409);
      expect(problemOf(conflict).code).toBe('AGT_ERR_IDEMPOTENCY_CONFLICT');
      expect(Number(await redis.hget(bucketKey(1, subject, 'writes'), 'tk'))).toBe(2_000_000);
    });

    it("an idempotency record lives no longer than its bucket's idle TTL (not the 1 h bound)", async () => {
      const subject = uniquePrefix('tenant');
      const idle = policies[1]!.idleTtlSeconds * 1000;
      expect(idle).toBeLessThan(3_600_000);
      await decide({ policy: 'reports', subject, idempotencyKey: 'order-43' });
      const ttl = await redis.pttl(idempotencyRecordKey(subject, 'order-43'));
      expect(ttl).toBeGreaterThan(idle - 5000);
      expect(ttl).toBeLessThanOrEqual(idle);
    });

    it('sends legacy X-RateLimit-* headers only when configured', async () => {
      const subject = uniquePrefix('tenant');
      const plain = DecisionResponse.parse((await decide({ policy: 'writes', subject })).json());
      expect(Object.keys(plain.headers).some((h) => h.startsWith('X-'))).toBe(false);
      const withLegacy = DecisionResponse.parse((await decide({ policy: 'writes', subject }, legacy)).json());
      expect(withLegacy.headers).toMatchObject({
        'X-RateLimit-Limit': '3',
        'X-RateLimit-Remaining': '1',
        'X-RateLimit-Reset': '2000',
      });
    });
  });

  describe('bad input: a stable code, a problem document, and nothing charged', () => {
    const subject = uniquePrefix('bad');
    const key = bucketKey(1, subject, 'writes');
    const cases: [
      string,
      () => Promise<{ statusCode: number; headers: Record<string, unknown>; body: string }>,
      number,
      string,
    ][] = [
      ['unknown policy', () => decide({ policy: 'nope', subject }), 404, 'AGT_ERR_UNKNOWN_POLICY'],
      [
        'bad subject',
        () => decide({ policy: 'writes', subject: 'has space' }),
        400,
        'AGT_ERR_INVALID_SUBJECT',
      ],
      [
        'subject with a brace',
        () => decide({ policy: 'writes', subject: `{${subject}}` }),
        400,
        'AGT_ERR_INVALID_SUBJECT',
      ],
      ['zero cost', () => decide({ policy: 'writes', subject, cost: 0 }), 400, 'AGT_ERR_INVALID_COST'],
      ['negative cost', () => decide({ policy: 'writes', subject, cost: -1 }), 400, 'AGT_ERR_INVALID_COST'],
      [
        'cost above maxCost',
        () => decide({ policy: 'reports', subject, cost: 11 }),
        400,
        'AGT_ERR_COST_ABOVE_MAX',
      ],
      [
        'too many checks',
        () =>
          decide({
            checks: Array.from({ length: 17 }, (_, i) => ({ policy: 'writes', subject: `${subject}-${i}` })),
          }),
        400,
        'AGT_ERR_TOO_MANY_CHECKS',
      ],
      [
        'the same check twice',
        () =>
          decide({
            checks: [
              { policy: 'writes', subject },
              { policy: 'writes', subject },
            ],
          }),
        400,
        'AGT_ERR_DUPLICATE_CHECK',
      ],
      [
        'an unknown field',
        () => decide({ policy: 'writes', subject, extra: 1 }),
        400,
        'AGT_ERR_INVALID_REQUEST',
      ],
      ['no subject', () => decide({ policy: 'writes' }), 400, 'AGT_ERR_INVALID_REQUEST'],
      [
        'malformed JSON',
        () =>
          agent.app.inject({
            method: 'POST',
            url: '/v1/decisions',
            headers: { 'content-type': 'application/json' },
            payload: `{"policy":"writes","subject":"${subject}",`,
          }),
        400,
        'AGT_ERR_MALFORMED_JSON',
      ],
      [
        'an oversized body',
        () =>
          agent.app.inject({
            method: 'POST',
            url: '/v1/decisions',
            headers: { 'content-type': 'application/json' },
            payload: JSON.stringify({ policy: 'writes', subject, pad: 'x'.repeat(20_000) }),
          }),
        413,
        'AGT_ERR_BODY_TOO_LARGE',
      ],
      [
        'a body that is not JSON',
        () =>
          agent.app.inject({
            method: 'POST',
            url: '/v1/decisions',
            headers: { 'content-type': 'text/plain' },
            payload: 'policy=writes',
          }),
        415,
        'AGT_ERR_UNSUPPORTED_MEDIA_TYPE',
      ],
      [
        'an unknown route',
        () => agent.app.inject({ method: 'GET', url: '/v1/nothing' }),
        404,
        'AGT_ERR_NOT_FOUND',
      ],
    ];
    for (const [name, send, status, code] of cases) {
      it(`${name} → ${status} ${code}`, async () => {
        const res = await send();
        expect(res.statusCode).toBe(status);
        const problem = problemOf(res);
        expect(problem).toMatchObject({ status, code, type: 'about:blank' });
        expect(problem.detail).toBeTruthy();
        expect(res.body).not.toContain('rl:v');
        expect(await redis.exists(key)).toBe(0);
      });
    }

    it('counts every refused request by code, never by subject', async () => {
      const metrics = (await agent.app.inject({ method: 'GET', url: '/metrics' })).body;
      expect(metrics).toMatch(/quotaplane_request_errors_total\{code="AGT_ERR_UNKNOWN_POLICY"\} [1-9]/);
      expect(metrics).not.toContain(subject);
    });
  });

  describe('health, readiness, metrics', () => {
    it('answers /healthz and /readyz, and /readyz turns 503 while draining', async () => {
      expect((await agent.app.inject({ method: 'GET', url: '/healthz' })).statusCode).toBe(200);
      const ready = await legacy.app.inject({ method: 'GET', url: '/readyz' });
      expect(ready.statusCode).toBe(200);
      expect(ready.json()).toMatchObject({ status: 'ready', policies: 4, store: 'closed' });
      legacy.drain();
      const draining = await legacy.app.inject({ method: 'GET', url: '/readyz' });
      expect(draining.statusCode).toBe(503);
      expect(problemOf(draining)).toMatchObject({ code: 'AGT_ERR_NOT_READY', errors: ['draining'] });
    });

    it('exports decisions by policy, region, decision and mode, store latency and process metrics', async () => {
      const text = (await agent.app.inject({ method: 'GET', url: '/metrics' })).body;
      expect(text).toMatch(
        /quotaplane_decisions_total\{policy="writes",region="us",decision="allowed",mode="regional"\} \d+/,
      );
      expect(text).toMatch(
        /quotaplane_decisions_total\{policy="writes",region="us",decision="denied",mode="regional"\} \d+/,
      );
      expect(text).toMatch(
        /quotaplane_store_latency_seconds_bucket\{le="[^"]+",operation="decide",outcome="ok"\}/,
      );
      expect(text).toMatch(/quotaplane_retry_after_seconds_count\{policy="writes",region="us"\} [1-9]/);
      expect(text).toContain('process_cpu_user_seconds_total');
      expect(text).not.toMatch(/tenant-|fa-|bad-/);
    });
  });
});
