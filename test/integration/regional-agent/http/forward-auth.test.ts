import type { InjectOptions } from 'fastify';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Problem } from '../../../../core/wire/agent.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import { uniqueIpv6Group, uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const SECRET = 'forward-auth-secret-of-this-test';
const policies = [
  parsePolicy({ name: 'writes', capacity: 3, refillPerSecond: 0.001, idleTtlSeconds: 3600 }),
  parsePolicy({ name: 'reports', capacity: 100, refillPerSecond: 1, maxCost: 10 }),
  // Homed in another region and no forwarder: every check fails closed with home_unreachable.
  parsePolicy({ name: 'far', capacity: 10, refillPerSecond: 1, mode: 'strict', homeRegion: 'eu' }),
];

let redis: Redis;
const fixtures: AgentFixture[] = [];

/** An agent on the suite's Redis (the first one's client serves all three). */
async function agent(over: Record<string, unknown>): Promise<AgentApp> {
  const fixture = await agentFixture({
    policies,
    ...(fixtures[0] === undefined ? {} : { redis: { client: fixtures[0].redis } }),
    config: { decisionDeadlineMs: 500, storeTimeoutMs: 500, ...over },
  });
  fixtures.push(fixture);
  return fixture.agent;
}

let open: AgentApp;
let secured: AgentApp;
let nobody: AgentApp;

beforeAll(async () => {
  open = await agent({ trustedProxies: ['127.0.0.1', '10.9.0.0/16'] });
  redis = fixtures[0]!.redis as Redis;
  secured = await agent({ trustedProxies: ['127.0.0.1'], forwardAuthSecret: SECRET });
  nobody = await agent({});
});
afterAll(async () => {
  for (const f of fixtures.reverse()) await f[Symbol.asyncDispose]();
});

const ask = (app: AgentApp, options: InjectOptions) => app.app.inject({ method: 'GET', ...options });

function problemOf(res: { headers: Record<string, unknown>; body: string }) {
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  return Problem.parse(JSON.parse(res.body));
}

describe('forward-auth answers trusted proxies only', () => {
  it('refuses a peer outside QP_TRUSTED_PROXIES with 400 AGT_ERR_UNTRUSTED_PROXY and charges nothing', async () => {
    const subject = uniquePrefix('victim');
    const res = await ask(open, {
      url: '/v1/forward-auth?policy=writes&cost=1',
      remoteAddress: '10.1.2.3',
      headers: { 'x-quota-subject': subject, 'x-quota-cost': '1' },
    });
    expect(res.statusCode).toBe(400);
    expect(problemOf(res)).toMatchObject({ code: 'AGT_ERR_UNTRUSTED_PROXY', status: 400 });
    expect(await redis.exists(bucketKey(1, subject, 'writes'))).toBe(0);
    const metrics = (await open.app.inject({ method: 'GET', url: '/metrics' })).body;
    expect(metrics).toMatch(/quotaplane_request_errors_total\{code="AGT_ERR_UNTRUSTED_PROXY"\} [1-9]/);
  });

  it('answers a peer inside a trusted range', async () => {
    const res = await ask(open, {
      url: '/v1/forward-auth?policy=writes',
      remoteAddress: '10.9.200.1',
      headers: { 'x-quota-subject': uniquePrefix('ok') },
    });
    expect(res.statusCode).toBe(204);
  });

  it('without any trusted proxy configured, answers nobody', async () => {
    const res = await ask(nobody, {
      url: '/v1/forward-auth?policy=writes',
      headers: { 'x-quota-subject': uniquePrefix('x') },
    });
    expect(res.statusCode).toBe(400);
    expect(problemOf(res).detail).toMatch(/no trusted proxy is configured/);
  });

  it('with a shared secret, refuses a missing or wrong one even from a trusted address', async () => {
    const subject = uniquePrefix('s');
    const url = '/v1/forward-auth?policy=writes';
    const missing = await ask(secured, { url, headers: { 'x-quota-subject': subject } });
    const wrong = await ask(secured, {
      url,
      headers: { 'x-quota-subject': subject, 'x-quota-secret': `${SECRET}x` },
    });
    for (const res of [missing, wrong]) {
      expect(res.statusCode).toBe(400);
      expect(problemOf(res)).toMatchObject({ code: 'AGT_ERR_UNTRUSTED_PROXY' });
      expect(problemOf(res).detail).toMatch(/x-quota-secret is missing or wrong/);
    }
    expect(await redis.exists(bucketKey(1, subject, 'writes'))).toBe(0);
    const right = await ask(secured, {
      url,
      headers: { 'x-quota-subject': subject, 'x-quota-secret': SECRET },
    });
    expect(right.statusCode).toBe(204);
    expect(right.headers['ratelimit']).toBe('"writes";r=2;t=1000');
  });

  it('uses the client address from X-Forwarded-For (IPv6 by /64), and never the proxy address alone', async () => {
    const base = uniqueIpv6Group();
    const first = await ask(open, {
      url: '/v1/forward-auth?policy=writes',
      headers: { 'x-forwarded-for': `2001:db8:${base}:7::1` },
    });
    expect(first.statusCode).toBe(204);
    // Another address of the same /64 shares the bucket.
    const second = await ask(open, {
      url: '/v1/forward-auth?policy=writes',
      headers: { 'x-forwarded-for': `2001:db8:${base}:7:ffff::2` },
    });
    expect(second.headers['ratelimit']).toMatch(/^"writes";r=1;/);
    expect(await redis.exists(bucketKey(1, `ip:2001:db8:${base}:7::/64`, 'writes'))).toBe(1);
    const bare = await ask(open, { url: '/v1/forward-auth?policy=writes' });
    expect(bare.statusCode).toBe(400);
    expect(problemOf(bare).code).toBe('AGT_ERR_MISSING_SUBJECT');
  });

  it('an X-Forwarded-For of trusted hops alone (or empty) names no client: 400, and no bucket of a proxy', async () => {
    // The peer (127.0.0.1) and 10.9.0.0/16 are trusted: each of these chains ends at a proxy, not a client.
    for (const xff of ['', '127.0.0.1', '10.9.0.4', '10.9.0.4, 127.0.0.1']) {
      const res = await ask(open, {
        url: '/v1/forward-auth?policy=writes',
        headers: { 'x-forwarded-for': xff },
      });
      expect(res.statusCode, xff).toBe(400);
      expect(problemOf(res).code).toBe('AGT_ERR_MISSING_SUBJECT');
    }
    for (const proxy of ['127.0.0.1', '10.9.0.4']) {
      expect(await redis.exists(bucketKey(1, `ip:${proxy}`, 'writes'))).toBe(0);
    }
    // An untrusted entry left of the trusted hops is the client.
    const client = await ask(open, {
      url: '/v1/forward-auth?policy=writes',
      headers: { 'x-forwarded-for': '198.51.100.7, 10.9.0.4' },
    });
    expect(client.statusCode).toBe(204);
  });
});

describe('each proxy gets the statuses it understands', () => {
  const over = async (url: string, headers: Record<string, string>) => {
    const codes: number[] = [];
    let last: Awaited<ReturnType<typeof ask>> | undefined;
    for (let i = 0; i < 4; i++) {
      last = await ask(open, { url, headers });
      codes.push(last.statusCode);
    }
    return { codes, last: last! };
  };

  it('generic and traefik: 204 while allowed, then 429 problem+json with Retry-After and the headers', async () => {
    for (const url of ['/v1/forward-auth?policy=writes', '/v1/forward-auth/traefik?policy=writes']) {
      const { codes, last } = await over(url, { 'x-quota-subject': uniquePrefix('t') });
      expect(codes).toEqual([204, 204, 204, 429]);
      expect(problemOf(last)).toMatchObject({
        type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
        code: 'RATE_LIMITED',
        'violated-policies': ['writes'],
      });
      expect(Number(last.headers['retry-after'])).toBeGreaterThanOrEqual(1000);
      expect(last.headers['ratelimit-policy']).toBe('"writes";q=3;w=3000');
      expect(last.headers['ratelimit']).toMatch(/^"writes";r=0;t=\d+$/);
      expect(last.headers['x-quota-status']).toBeUndefined();
    }
  });

  it('nginx (by path or by query): 204, then 403 naming 429 in X-Quota-Status and the code in X-Quota-Code', async () => {
    for (const url of [
      '/v1/forward-auth/nginx?policy=writes',
      '/v1/forward-auth?policy=writes&proxy=nginx',
    ]) {
      const { codes, last } = await over(url, { 'x-quota-subject': uniquePrefix('n') });
      expect(codes).toEqual([204, 204, 204, 403]);
      expect(last.headers['x-quota-status']).toBe('429');
      expect(last.headers['x-quota-code']).toBe('RATE_LIMITED');
      expect(Number(last.headers['retry-after'])).toBeGreaterThanOrEqual(1000);
      expect(last.headers['ratelimit']).toMatch(/^"writes";r=0;t=\d+$/);
    }
  });

  it('nginx: every refusal is a 403 carrying its real status, bad input and unknown policies included', async () => {
    const subject = uniquePrefix('n');
    const cases: [string, Record<string, string>, string, string][] = [
      [
        '/v1/forward-auth/nginx?policy=writes&cost=abc',
        { 'x-quota-subject': subject },
        '400',
        'AGT_ERR_INVALID_QUERY',
      ],
      ['/v1/forward-auth/nginx?policy=nope', { 'x-quota-subject': subject }, '404', 'AGT_ERR_UNKNOWN_POLICY'],
      [
        '/v1/forward-auth/nginx?policy=writes',
        { 'x-quota-subject': 'bad subject' },
        '400',
        'AGT_ERR_INVALID_SUBJECT',
      ],
      ['/v1/forward-auth/nginx?policy=writes', {}, '400', 'AGT_ERR_MISSING_SUBJECT'],
      ['/v1/forward-auth/nginx?policy=far', { 'x-quota-subject': subject }, '503', 'LIMITER_UNAVAILABLE'],
    ];
    for (const [url, headers, status, code] of cases) {
      const res = await ask(open, { url, headers });
      expect([res.statusCode, res.headers['x-quota-status'], res.headers['x-quota-code']]).toEqual([
        403,
        status,
        code,
      ]);
    }
    const untrusted = await ask(open, {
      url: '/v1/forward-auth/nginx?policy=writes',
      remoteAddress: '192.0.2.1',
      headers: { 'x-quota-subject': subject },
    });
    expect([untrusted.statusCode, untrusted.headers['x-quota-status']]).toEqual([403, '400']);
    expect(untrusted.headers['x-quota-code']).toBe('AGT_ERR_UNTRUSTED_PROXY');
  });

  it('envoy: any method on /v1/forward-auth/envoy/<original path>, 200 allows, policy and cost in headers', async () => {
    const subject = uniquePrefix('e');
    const ok = await ask(open, {
      method: 'POST',
      url: '/v1/forward-auth/envoy/api/reports?page=2&anything=goes',
      headers: { 'x-quota-subject': subject, 'x-quota-policy': 'reports', 'x-quota-cost': '4' },
    });
    expect(ok.statusCode).toBe(200);
    expect(ok.body).toBe('');
    expect(ok.headers['ratelimit']).toMatch(/^"reports";r=96;/);
    const root = await ask(open, {
      url: '/v1/forward-auth/envoy',
      headers: { 'x-quota-subject': subject, 'x-quota-policy': 'reports', 'x-quota-cost': '10' },
    });
    expect(root.statusCode).toBe(200);
    const { codes, last } = await over('/v1/forward-auth/envoy/x', {
      'x-quota-subject': uniquePrefix('e'),
      'x-quota-policy': 'writes',
    });
    expect(codes).toEqual([200, 200, 200, 429]);
    expect(problemOf(last).code).toBe('RATE_LIMITED');
    const noPolicy = await ask(open, {
      url: '/v1/forward-auth/envoy/api',
      headers: { 'x-quota-subject': subject },
    });
    expect(noPolicy.statusCode).toBe(400);
    expect(problemOf(noPolicy).code).toBe('AGT_ERR_INVALID_QUERY');
  });

  it('a fail-closed policy that cannot be decided is 503 LIMITER_UNAVAILABLE with Retry-After, nginx aside', async () => {
    for (const url of ['/v1/forward-auth?policy=far', '/v1/forward-auth/envoy/x']) {
      const res = await ask(open, {
        url,
        headers: { 'x-quota-subject': uniquePrefix('f'), 'x-quota-policy': 'far' },
      });
      expect(res.statusCode).toBe(503);
      expect(problemOf(res)).toMatchObject({ code: 'LIMITER_UNAVAILABLE', 'violated-policies': ['far'] });
      expect(res.headers['retry-after']).toBe('1');
    }
  });

  it('takes the cost from the query before the header, and refuses an unknown proxy', async () => {
    const subject = uniquePrefix('c');
    const ok = await ask(open, {
      url: '/v1/forward-auth?policy=reports&cost=7',
      headers: { 'x-quota-subject': subject, 'x-quota-cost': '2' },
    });
    expect(ok.statusCode).toBe(204);
    expect(ok.headers['ratelimit']).toMatch(/^"reports";r=93;/);
    const bad = await ask(open, {
      url: '/v1/forward-auth?policy=reports&proxy=haproxy',
      headers: { 'x-quota-subject': subject },
    });
    expect(bad.statusCode).toBe(400);
    expect(problemOf(bad).code).toBe('AGT_ERR_INVALID_QUERY');
  });
});
