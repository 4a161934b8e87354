/**
 * Fuzzing every edge a caller reaches (fast-check, bounded runs): the agent's POST /v1/decisions, GET /v1/explain,
 * every forward-auth route (generic, nginx, traefik, Envoy ext_authz; from a trusted proxy and from any other
 * peer) and its gRPC rate-limit service, on a Redis of this file's own; and the coordinator's admin API (every
 * route and method, any credentials) on a real NATS. Whatever arrives, the answer is a decision or a 4xx problem,
 * never a 5xx; a 4xx changes nothing in Redis (every key is read back, SCAN and DUMP) and no policy; the store
 * breaker stays closed; and a bystander tenant's next decision is exactly what it would have been. The NATS
 * messages an agent or the coordinator receives are fuzzed through their adapters in fuzz-nats.test.ts.
 */
import fc from 'fast-check';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../core/policy/policy.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { RlsError } from '../../../regional-agent/grpc/rls-service.js';
import { uniquePrefix } from '../../harness/fixtures.js';
import { redisSnapshot } from '../../helpers/redis-snapshot.js';
import {
  admin,
  coordinatorFixture,
  reader,
  type CoordinatorFixture,
} from '../../helpers/coordinator-fixture.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

const RUNS = 120;
const policies = [
  parsePolicy({ name: 'writes', capacity: 5, refillPerSecond: 0.001, idleTtlSeconds: 6000 }),
  parsePolicy({
    name: 'bulk',
    capacity: 1000,
    refillPerSecond: 0.001,
    maxCost: 50,
    idleTtlSeconds: 1_000_000,
  }),
];

let fixture: AgentFixture;
let redis: Redis;
let agent: AgentApp;
const run = uniquePrefix('fz');
const pool = [`${run}-a`, `${run}-b`];
const victim = `${run}-victim`;

/** Every key of this file's Redis and its value: a junk write anywhere shows. */
const snapshot = (): Promise<string> => redisSnapshot(redis);

/** The victim's own decision: one token of `bulk`, remaining must fall by exactly one each time. */
let victimRemaining = 1000;
async function victimDecides(): Promise<void> {
  const r = await agent.app.inject({
    method: 'POST',
    url: '/v1/decisions',
    payload: { policy: 'bulk', subject: victim },
  });
  expect(r.statusCode).toBe(200);
  const body = r.json<{ allowed: boolean; results: { remaining: number }[] }>();
  victimRemaining--;
  expect(body).toMatchObject({ allowed: true, results: [{ remaining: victimRemaining }] });
}

const junk = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.constantFrom('', ' ', '{x}', 'h.abc', 'a'.repeat(200), '\u0000', '../../etc', 'ünï'),
);
const cost = fc.oneof(
  fc.double(),
  fc.integer({ min: -5, max: 2000 }),
  fc.constantFrom(0, 1e-7, 1e-6, 0.5, 1, 50, 51, 1e300, -0, 'NaN', '1', null, true, [], {}),
);
const check = fc.record(
  {
    policy: fc.oneof(fc.constantFrom('writes', 'bulk', 'nope'), junk),
    subject: fc.oneof(fc.constantFrom(...pool), junk),
    cost,
  },
  { requiredKeys: [] },
);
const body = fc.oneof(
  fc.anything(),
  check,
  fc.record(
    {
      checks: fc.oneof(fc.array(check, { maxLength: 20 }), fc.anything()),
      idempotencyKey: fc.oneof(fc.string({ maxLength: 300 }), fc.anything()),
      dryRun: fc.oneof(fc.boolean(), fc.anything()),
      extra: fc.anything(),
    },
    { requiredKeys: [] },
  ),
);

describe('fuzzing the agent on a real Redis', () => {
  beforeAll(async () => {
    fixture = await agentFixture({
      policies,
      redis: 'own',
      config: { trustedProxies: ['127.0.0.1'], breakerVolumeThreshold: 1 },
    });
    ({ agent } = fixture);
    redis = fixture.redis as Redis;
  });
  afterAll(async () => {
    await fixture?.[Symbol.asyncDispose]();
  });

  it('POST /v1/decisions: a decision or a 4xx, and a 4xx changes no bucket, no breaker, no other decision', async () => {
    await fc.assert(
      fc.asyncProperty(body, async (payload) => {
        const before = await snapshot();
        const r = await agent.app.inject({
          method: 'POST',
          url: '/v1/decisions',
          headers: { 'content-type': 'application/json' },
          payload: JSON.stringify(payload) ?? 'undefined',
        });
        expect(r.statusCode).toBeLessThan(500);
        if (r.statusCode >= 400) {
          expect(r.headers['content-type']).toMatch(/^application\/problem\+json/);
          expect(await snapshot()).toBe(before);
        }
        expect(agent.guard.state).toBe('closed');
        await victimDecides();
      }),
      { numRuns: RUNS },
    );
  }, 30_000);

  /** A forward-auth answer that is a decision (admitted, or refused for quota), whatever the proxy's dialect. */
  const isDecision = (r: { statusCode: number; headers: Record<string, unknown> }) =>
    r.statusCode < 300 || r.statusCode === 429 || r.headers['x-quota-status'] === '429';

  it('every forward-auth route, from a trusted proxy or any other peer: no 5xx, and anything but a decision charges nothing', async () => {
    const value = fc.oneof(junk, fc.constantFrom('writes', 'bulk', '1', '0', '-1', '1e-7', '1e999', '51'));
    // Mostly well-formed values, so decisions are reached as well as every kind of refusal.
    const often = <T>(good: fc.Arbitrary<T>, any: fc.Arbitrary<T>) =>
      fc.oneof({ arbitrary: good, weight: 2 }, { arbitrary: any, weight: 1 });
    let decided = 0;
    const route = fc.constantFrom(
      'GET /v1/forward-auth',
      'GET /v1/forward-auth?proxy=nginx',
      'GET /v1/forward-auth/nginx',
      'GET /v1/forward-auth/traefik',
      'GET /v1/forward-auth/envoy',
      'POST /v1/forward-auth/envoy/orders/42',
      'DELETE /v1/forward-auth/envoy/x',
      `GET /v1/forward-auth/envoy/${'a'.repeat(300)}`,
      'GET /v1/forward-auth/envoy/%zz',
    );
    await fc.assert(
      fc.asyncProperty(
        route,
        fc.constantFrom('127.0.0.1', '127.0.0.1', '10.9.9.9', '::1'),
        often(fc.constantFrom('writes', 'bulk'), value),
        often(fc.constantFrom('1', '2'), value),
        often(fc.constantFrom(...pool), junk),
        often(fc.constantFrom('1', '2'), value),
        fc.oneof(junk, fc.constantFrom('writes', 'bulk')),
        async (which, peer, policy, costQuery, subject, costHeader, policyHeader) => {
          const [method, url] = which.split(' ') as ['GET' | 'POST' | 'DELETE', string];
          const before = await snapshot();
          const headers: Record<string, string> = {};
          // A header value must be representable on the wire; others would never reach the agent.
          const wire = (v: string) => /^[\x20-\x7e]*$/.test(v);
          if (wire(subject)) headers['x-quota-subject'] = subject;
          if (wire(costHeader)) headers['x-quota-cost'] = costHeader;
          if (wire(policyHeader)) headers['x-quota-policy'] = policyHeader;
          const r = await agent.app.inject({
            method,
            url,
            query: { policy, cost: costQuery },
            headers,
            remoteAddress: peer,
          });
          expect(r.statusCode).toBeLessThan(500);
          if (peer === '10.9.9.9') {
            // Not a trusted proxy: refused whatever it sends, and nothing charged.
            expect(isDecision(r)).toBe(false);
          }
          if (!isDecision(r)) expect(await snapshot()).toBe(before);
          else decided++;
          expect(agent.guard.state).toBe('closed');
          await victimDecides();
        },
      ),
      { numRuns: RUNS },
    );
    // The generator reaches decisions too, not only refusals.
    expect(decided).toBeGreaterThan(0);
  }, 60_000);

  it('GET /v1/explain with any query: no 5xx, and it never writes', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.record(
          {
            policy: fc.oneof(fc.constantFrom('writes', 'bulk', 'nope'), junk),
            subject: fc.oneof(fc.constantFrom(...pool), junk),
            cost: fc.oneof(junk, fc.constantFrom('1', '0', '1e-7', '51')),
            extra: junk,
          },
          { requiredKeys: [] },
        ),
        async (query) => {
          const before = await snapshot();
          const r = await agent.app.inject({ method: 'GET', url: '/v1/explain', query });
          expect(r.statusCode).toBeLessThan(500);
          expect(await snapshot()).toBe(before);
          expect(agent.guard.state).toBe('closed');
          await victimDecides();
        },
      ),
      { numRuns: RUNS },
    );
  }, 60_000);

  it('the gRPC rate-limit service with any request: an answer or a gRPC error, and an error charges nothing', async () => {
    const entry = fc.record({
      key: fc.oneof(fc.constantFrom('policy', 'subject', 'tenant'), junk),
      value: fc.oneof(fc.constantFrom('writes', 'bulk', ...pool), junk),
    });
    const request = fc.oneof(
      fc.anything(),
      fc.record(
        {
          domain: fc.oneof(fc.constant('fuzz'), junk),
          descriptors: fc.oneof(
            fc.array(fc.record({ entries: fc.array(entry, { maxLength: 4 }) }), { maxLength: 4 }),
            fc.anything(),
          ),
          hits_addend: fc.oneof(fc.integer({ min: -2, max: 60 }), fc.anything()),
        },
        { requiredKeys: [] },
      ),
    );
    let answered = 0;
    await fc.assert(
      fc.asyncProperty(request, async (raw) => {
        const before = await snapshot();
        const answer = await agent.rls.shouldRateLimit(raw, 2000).then(
          () => 'answer',
          (error: unknown) => error,
        );
        if (answer !== 'answer') {
          expect(answer).toBeInstanceOf(RlsError);
          expect(await snapshot()).toBe(before);
        } else answered++;
        expect(agent.guard.state).toBe('closed');
        await victimDecides();
      }),
      {
        numRuns: RUNS,
        // Random requests are answered only 2 to 6 times in 120 (the rest are gRPC errors), so a run could end
        // with none answered: two well-formed requests always run too, and both must be answered.
        examples: [
          [{ domain: 'fuzz', descriptors: [{ entries: [{ key: 'policy', value: 'writes' }] }] }],
          [
            {
              domain: 'fuzz',
              descriptors: [
                {
                  entries: [
                    { key: 'policy', value: 'writes' },
                    { key: 'subject', value: pool[0] },
                  ],
                },
              ],
              hits_addend: 1,
            },
          ],
        ],
      },
    );
    expect(answered).toBeGreaterThanOrEqual(2);
  }, 60_000);
});

describe('fuzzing the admin API on a real NATS', () => {
  let f: CoordinatorFixture;
  beforeAll(async () => {
    f = await coordinatorFixture();
    const seeded = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/exports',
      headers: { ...admin, 'content-type': 'application/json' },
      payload: JSON.stringify({ capacity: 10, refillPerSecond: 1 }),
    });
    expect(seeded.statusCode).toBe(201);
  });
  afterAll(async () => {
    await f?.close();
  });

  it('PUT and PATCH with any body: a 4xx changes no policy and writes no audit record', async () => {
    const listing = async () => (await f.app.inject({ url: '/v1/policies', headers: reader })).body;
    const audited = async () =>
      (await f.app.inject({ url: '/v1/audit?limit=1000', headers: reader })).json<{ entries: unknown[] }>()
        .entries.length;
    const field = fc.oneof(fc.double(), fc.integer(), fc.string({ maxLength: 10 }), fc.constant(null));
    const policyBody = fc.oneof(
      fc.anything(),
      fc.record(
        {
          capacity: field,
          refillPerSecond: field,
          maxCost: field,
          mode: fc.oneof(fc.constantFrom('regional', 'strict', 'local'), junk),
          homeRegion: fc.oneof(fc.constantFrom('us', 'mars'), junk),
          onStoreFailure: fc.oneof(fc.constantFrom('closed', 'open', 'local'), junk),
          idleTtlSeconds: field,
          version: field,
          minShare: field,
        },
        { requiredKeys: [] },
      ),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(
          'PUT /v1/policies/exports',
          'PUT /v1/policies/Bad%20Name',
          'PATCH /v1/policies/exports/budget',
        ),
        policyBody,
        async (route, payload) => {
          const [method, url] = route.split(' ') as ['PUT' | 'PATCH', string];
          const before = await listing();
          const trail = await audited();
          const r = await f.app.inject({
            method,
            url,
            headers: { ...admin, 'content-type': 'application/json' },
            payload: JSON.stringify(payload) ?? 'undefined',
          });
          expect(r.statusCode).toBeLessThan(500);
          if (r.statusCode >= 400) {
            expect(await listing()).toBe(before);
            expect(await audited()).toBe(trail);
          }
        },
      ),
      { numRuns: 60 },
    );
  }, 30_000);

  it('every admin route and method with any credentials and query: no 5xx, and no policy changes', async () => {
    const listing = async () => (await f.app.inject({ url: '/v1/policies', headers: reader })).body;
    const name = fc.oneof(fc.constantFrom('exports', 'missing', 'Bad%20Name', '..', '%00'), junk);
    const route = fc.oneof(
      fc.constantFrom('GET /v1/policies', 'GET /v1/regions', 'GET /v1/allocations'),
      name.map((n) => `GET /v1/policies/${encodeURIComponent(n)}`),
      // DELETE of the seeded policy always carries an If-Match that is not its ETag (so it must be refused).
      name.filter((n) => n !== 'exports').map((n) => `DELETE /v1/policies/${encodeURIComponent(n)}`),
      fc.constant('DELETE /v1/policies/exports'),
      name.map((n) => `GET /v1/allocations/history?policy=${encodeURIComponent(n)}`),
    );
    const query = fc.record(
      { limit: fc.oneof(junk, fc.integer().map(String)), before: junk, policy: name, extra: junk },
      { requiredKeys: [] },
    );
    const credentials = fc.oneof(
      fc.constant(admin),
      fc.constant(reader),
      fc.constant({}),
      junk.filter((v) => /^[\x20-\x7e]*$/.test(v)).map((v) => ({ authorization: v })),
      junk.filter((v) => /^[\x20-\x7e]*$/.test(v)).map((v) => ({ authorization: `Bearer ${v}` })),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          route,
          query.map((q) => ({ audit: q })),
        ),
        credentials,
        async (which, auth) => {
          const before = await listing();
          const r =
            typeof which === 'string'
              ? await f.app.inject({
                  method: which.split(' ')[0] as 'GET' | 'DELETE',
                  url: which.split(' ')[1]!,
                  headers: { ...auth, 'if-match': '"not-its-etag"' },
                })
              : await f.app.inject({ method: 'GET', url: '/v1/audit', query: which.audit, headers: auth });
          expect(r.statusCode).toBeLessThan(500);
          if (r.statusCode >= 400) {
            expect(r.headers['content-type']).toMatch(/^application\/problem\+json/);
          }
          expect(await listing()).toBe(before);
        },
      ),
      { numRuns: 150 },
    );
  }, 60_000);
});
