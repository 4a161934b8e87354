/**
 * Envoy's global rate-limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on a real
 * agent over real gRPC, deciding on a real Redis.
 */
import type { ServiceError } from '@grpc/grpc-js';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { PolicySource } from '../../../../regional-agent/policies/policy-source.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { buildApp, type AgentApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { rlsClient, type RlsCall, type RlsClient } from '../../../../regional-agent/grpc/rls-client.js';
import { listenRls, type RlsListener } from '../../../../regional-agent/grpc/rls-server.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import { decisionRedisOptions, whenReady } from '../../../../regional-agent/redis/connect.js';
import { RedisDecisionStore } from '../../../../regional-agent/redis/decision-store.js';
import type { RedisServer } from '../../../harness/backend.js';
import { backend, uniqueIpv6Group, uniquePrefix } from '../../../harness/fixtures.js';

const policies = [
  // 3 per minute, burst 3.
  parsePolicy({ name: 'reports', capacity: 3, refillPerSecond: 0.05, idleTtlSeconds: 3600 }),
  parsePolicy({ name: 'pages', capacity: 100, refillPerSecond: 1, maxCost: 50 }),
  parsePolicy({ name: 'ceiling', capacity: 2, refillPerSecond: 0.001, idleTtlSeconds: 3600 }),
  parsePolicy({ name: 'anon', capacity: 10, refillPerSecond: 1.5 }),
  parsePolicy({ name: 'lenient', capacity: 5, refillPerSecond: 1, onStoreFailure: 'open' }),
];

const rules = {
  rules: [
    {
      domain: 'edge',
      entries: [{ key: 'generic_key', value: 'reports' }, { key: 'tenant' }],
      policy: 'reports',
      subject: 'tenant:{tenant}',
    },
    { domain: 'edge', entries: [{ key: 'remote_address' }], policy: 'anon', subject: '{remote_address:ip}' },
    {
      domain: '*',
      entries: [{ key: 'policy' }, { key: 'subject' }],
      policy: '{policy}',
      subject: '{subject}',
    },
  ],
};

let redisServer: RedisServer;
let redis: Redis;
const apps: AgentApp[] = [];
const listeners: RlsListener[] = [];
const clients: RlsClient[] = [];

async function serve(source: PolicySource): Promise<{ agent: AgentApp; client: RlsClient }> {
  const agent = buildApp(
    {
      store: new RedisDecisionStore(redis),
      policies: source,
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: redisServer.url,
      policiesFile: 'unused',
      decisionDeadlineMs: 100,
      breakerResetMs: 1000,
      rlsRules: JSON.stringify(rules),
    }),
  );
  apps.push(agent);
  const listener = await listenRls(agent.rls, '127.0.0.1', 0);
  agent.attach(listener);
  listeners.push(listener);
  const client = rlsClient(listener.url);
  clients.push(client);
  return { agent, client };
}

let agent: AgentApp;
let client: RlsClient;

beforeAll(async () => {
  redisServer = await backend().startRedis();
  redis = new Redis({ host: redisServer.host, port: redisServer.port, ...decisionRedisOptions });
  redis.on('error', () => undefined);
  await whenReady(redis, 10_000);
  ({ agent, client } = await serve(new StaticPolicySource(policies)));
  await agent.ready;
});

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(apps.map((a) => a.close().catch(() => undefined)));
  redis?.disconnect();
  await redisServer?.[Symbol.asyncDispose]();
});

const tenant = (t: string): RlsCall['descriptors'][number] => ({
  entries: [
    { key: 'generic_key', value: 'reports' },
    { key: 'tenant', value: t },
  ],
});
const generic = (policy: string, subject: string): RlsCall['descriptors'][number] => ({
  entries: [
    { key: 'policy', value: policy },
    { key: 'subject', value: subject },
  ],
});
const headersOf = (r: { response_headers_to_add: { key: string; value: string }[] }) =>
  Object.fromEntries(r.response_headers_to_add.map((h) => [h.key, h.value]));
const failure = async (call: Promise<unknown>): Promise<ServiceError> => {
  try {
    await call;
  } catch (error) {
    return error as ServiceError;
  }
  throw new Error('the call succeeded');
};

describe('ShouldRateLimit over gRPC against a real agent', () => {
  it('maps domain and descriptors to a policy and subject: OK, then OVER_LIMIT with the limit, remaining and reset', async () => {
    const t = uniquePrefix('acme');
    const answers = [];
    for (let i = 0; i < 4; i++)
      answers.push(await client.shouldRateLimit({ domain: 'edge', descriptors: [tenant(t)] }));
    expect(answers.map((a) => a.overall_code)).toEqual(['OK', 'OK', 'OK', 'OVER_LIMIT']);
    expect(answers[0]!.statuses).toEqual([
      {
        code: 'OK',
        current_limit: { name: 'reports', requests_per_unit: 3, unit: 'MINUTE' },
        limit_remaining: 2,
        duration_until_reset: { seconds: 20, nanos: 0 },
      },
    ]);
    expect(answers.slice(0, 3).map((a) => a.statuses[0]!.limit_remaining)).toEqual([2, 1, 0]);
    expect(headersOf(answers[0]!)).toEqual({
      'ratelimit-policy': '"reports";q=3;w=60',
      ratelimit: '"reports";r=2;t=20',
    });
    const over = answers[3]!;
    expect(over.statuses[0]).toMatchObject({ code: 'OVER_LIMIT', limit_remaining: 0 });
    const wait = over.statuses[0]!.duration_until_reset!;
    expect(wait.seconds * 1000 + wait.nanos / 1e6).toBeGreaterThan(19_000);
    expect(wait.seconds * 1000 + wait.nanos / 1e6).toBeLessThanOrEqual(20_000);
    const h = headersOf(over);
    expect(h['retry-after']).toBe('20');
    // draft-11: t is when the quota is whole again (a window of 60 s); Retry-After when the cost fits.
    expect(h['ratelimit']).toBe('"reports";r=0;t=60');
    expect(h['content-type']).toBe('application/problem+json');
    expect(JSON.parse(Buffer.from(over.raw_body!).toString())).toMatchObject({
      status: 429,
      code: 'RATE_LIMITED',
      'violated-policies': ['reports'],
    });
    expect(await redis.exists(bucketKey(1, `tenant:${t}`, 'reports'))).toBe(1);
  });

  it('hits_addend is the cost', async () => {
    const s = uniquePrefix('s');
    const r = await client.shouldRateLimit({
      domain: 'any',
      descriptors: [generic('pages', s)],
      hits_addend: 30,
    });
    expect(r.statuses[0]).toMatchObject({ code: 'OK', limit_remaining: 70 });
    expect(r.statuses[0]!.current_limit).toEqual({ name: 'pages', requests_per_unit: 1, unit: 'SECOND' });
    await client.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', s)], hits_addend: 50 });
    const over = await client.shouldRateLimit({
      domain: 'any',
      descriptors: [generic('pages', s)],
      hits_addend: 21,
    });
    expect(over.overall_code).toBe('OVER_LIMIT');
    expect(over.statuses[0]!.limit_remaining).toBe(20);
  });

  it('decides all descriptors of a request together: one over limit charges none', async () => {
    const s = uniquePrefix('layer');
    const both = { domain: 'any', descriptors: [generic('pages', s), generic('ceiling', s)] };
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await client.shouldRateLimit(both));
    expect(answers.map((a) => a.overall_code)).toEqual(['OK', 'OK', 'OVER_LIMIT']);
    expect(answers[2]!.statuses.map((x) => x.code)).toEqual(['OK', 'OVER_LIMIT']);
    // pages was not charged by the refused request: it still holds 98 (plus refill).
    const probe = await client.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', s)] });
    expect(probe.statuses[0]!.limit_remaining).toBeGreaterThanOrEqual(97);
    expect(probe.statuses[0]!.limit_remaining).toBeLessThanOrEqual(99);
  });

  it('two descriptors naming the same bucket charge it once each', async () => {
    const s = uniquePrefix('dup');
    const r = await client.shouldRateLimit({
      domain: 'any',
      descriptors: [generic('pages', s), generic('pages', s)],
      hits_addend: 4,
    });
    expect(r.statuses.map((x) => x.limit_remaining)).toEqual([92, 92]);
  });

  it('a descriptor no rule matches is not limited, and counted', async () => {
    const r = await client.shouldRateLimit({
      domain: 'edge',
      descriptors: [{ entries: [{ key: 'header_match', value: 'unknown' }] }, tenant(uniquePrefix('t'))],
    });
    expect(r.overall_code).toBe('OK');
    expect(r.statuses[0]).toEqual({ code: 'OK', limit_remaining: 0 });
    expect(r.statuses[1]).toMatchObject({ code: 'OK', limit_remaining: 2 });
    const metrics = await agent.metrics.registry.metrics();
    expect(metrics).toMatch(/quotaplane_rls_descriptors_total\{outcome="unmatched"\} [1-9]/);
    expect(metrics).toMatch(/quotaplane_rls_requests_total\{outcome="ok"\} [1-9]/);
  });

  it('maps a remote address to its subject: IPv6 by its /64', async () => {
    const base = uniqueIpv6Group();
    const ask = (ip: string) =>
      client.shouldRateLimit({
        domain: 'edge',
        descriptors: [{ entries: [{ key: 'remote_address', value: ip }] }],
      });
    await ask(`2001:db8:${base}:9::1`);
    const second = await ask(`2001:db8:${base}:9:ffff::7`);
    expect(second.statuses[0]!.limit_remaining).toBe(8);
    expect(await redis.exists(bucketKey(1, `ip:2001:db8:${base}:9::/64`, 'anon'))).toBe(1);
    const bad = await failure(ask('not-an-ip'));
    expect(bad.code).toBe(3);
    expect(bad.details).toMatch(/remote_address "not-an-ip" is not an IP address/);
  });

  it('answers bad input with INVALID_ARGUMENT and an unknown policy with NOT_FOUND, charging nothing', async () => {
    const s = uniquePrefix('bad');
    const empty = await failure(client.shouldRateLimit({ domain: 'edge', descriptors: [] }));
    expect([empty.code, empty.details]).toEqual([3, expect.stringMatching(/descriptors/)]);
    const tooMuch = await failure(
      client.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', s)], hits_addend: 51 }),
    );
    expect([tooMuch.code, tooMuch.details]).toEqual([3, expect.stringMatching(/above the largest cost/)]);
    const badSubject = await failure(
      client.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', 'a b')] }),
    );
    expect(badSubject.code).toBe(3);
    const unknown = await failure(
      client.shouldRateLimit({ domain: 'any', descriptors: [generic('nope', s)] }),
    );
    expect([unknown.code, unknown.details]).toEqual([5, 'Unknown policy nope']);
    expect(await redis.exists(bucketKey(1, s, 'pages'))).toBe(0);
    const metrics = await agent.metrics.registry.metrics();
    expect(metrics).toMatch(/quotaplane_request_errors_total\{code="AGT_ERR_UNKNOWN_POLICY"\} [1-9]/);
    expect(metrics).toMatch(/quotaplane_rls_requests_total\{outcome="not_found"\} [1-9]/);
  });

  it('is UNAVAILABLE until the agent knows its policies', async () => {
    const never: PolicySource = {
      current: () => new Map(),
      ready: () => new Promise(() => undefined),
      onChange: () => () => undefined,
      close: () => Promise.resolve(),
    };
    const { client: early } = await serve(never);
    const error = await failure(
      early.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', 'x')] }),
    );
    expect([error.code, error.details]).toEqual([14, 'The agent is not ready: policies are not loaded yet']);
  });

  it('with Redis frozen, each policy failure mode: closed is OVER_LIMIT saying why, open is OK', async () => {
    const s = uniquePrefix('frozen');
    await redisServer.pause();
    try {
      const closed = await client.shouldRateLimit({ domain: 'any', descriptors: [generic('pages', s)] });
      expect(closed.overall_code).toBe('OVER_LIMIT');
      expect(headersOf(closed)['retry-after']).toBe('1');
      expect(JSON.parse(Buffer.from(closed.raw_body!).toString())).toMatchObject({
        code: 'LIMITER_UNAVAILABLE',
      });
      const open = await client.shouldRateLimit({ domain: 'any', descriptors: [generic('lenient', s)] });
      expect(open.overall_code).toBe('OK');
    } finally {
      await redisServer.resume();
    }
  });
});
