/**
 * Forward-auth behind a real nginx (Debian's), configured with the very block docs/proxies.md shows: a real
 * agent on a Redis this test owns, a small service behind nginx, and clients with basic-auth identities.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import type { RedisServer } from '../../../harness/backend.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { startNginx, type NginxServer } from '../../../harness/nginx.js';
import { docBlock, substitute } from '../../../helpers/doc-blocks.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const documented = docBlock('proxies.md', 'forward-auth-nginx');
const SECRET = /X-Quota-Secret\s+"([^"]+)"/.exec(documented)![1]!;

const policies = [
  parsePolicy({ name: 'reports', capacity: 3, refillPerSecond: 0.001, idleTtlSeconds: 3600 }),
  parsePolicy({
    name: 'search',
    capacity: 10,
    refillPerSecond: 0.001,
    idleTtlSeconds: 20_000,
    maxCost: 2,
    onStoreFailure: 'open',
  }),
];

let fixture: AgentFixture;
let redisServer: RedisServer;
let redis: Redis;
let agent: AgentApp;
let service: Server;
let nginx: NginxServer;
/** Users nginx knows; each test takes its own, so buckets never mix. */
const run = uniquePrefix('n').replace(/[^a-z0-9]/g, '');
const user = (name: string) => `${name}${run}`;
const USERS = ['alice', 'bob', 'carol', 'dave', 'erin'].map(user);
const BAD_USER = `bad*${run}`;

beforeAll(async () => {
  fixture = await agentFixture({
    policies,
    redis: 'own',
    listen: true,
    config: {
      decisionDeadlineMs: 100,
      storeTimeoutMs: 100,
      breakerResetMs: 1000,
      trustedProxies: ['127.0.0.1'],
      forwardAuthSecret: SECRET,
    },
  });
  ({ agent, redis } = fixture as AgentFixture & { redis: Redis });
  redisServer = fixture.server!;
  const agentAddress = fixture.url;

  // The protected service: says which path it served and what it was told.
  service = createServer((req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ path: req.url, headers: req.headers }));
  });
  await new Promise<void>((resolve) => service.listen(0, '127.0.0.1', resolve));
  const servicePort = (service.address() as AddressInfo).port;

  nginx = await startNginx(({ port, dir }) => {
    const passwords = join(dir, 'users.htpasswd');
    writeFileSync(passwords, [...USERS, BAD_USER].map((u) => `${u}:{PLAIN}pw-${u}\n`).join(''));
    return substitute(documented, {
      'server 127.0.0.1:7101;': `server ${new URL(agentAddress).host};`,
      'server 127.0.0.1:8080;': `server 127.0.0.1:${servicePort};`,
      'listen 127.0.0.1:8000;': `listen 127.0.0.1:${port};`,
      '/etc/nginx/quotaplane.htpasswd': passwords,
    });
  });
});

afterAll(async () => {
  await nginx?.[Symbol.asyncDispose]();
  await new Promise((resolve) => service?.close(resolve));
  await fixture?.[Symbol.asyncDispose]();
});

async function get(path: string, name: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${nginx.url}${path}`, {
    headers: { authorization: `Basic ${Buffer.from(`${name}:pw-${name}`).toString('base64')}`, ...headers },
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

describe('forward-auth behind a real nginx, configured as docs/proxies.md says', () => {
  it('200 while within quota, then 429 with Retry-After, the RateLimit headers and a problem document', async () => {
    const alice = USERS[0]!;
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push(await get('/api/reports/1', alice));
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 429, 429]);
    expect(answers.slice(0, 3).map((a) => a.headers.get('ratelimit'))).toEqual([
      '"reports";r=2;t=1000',
      '"reports";r=1;t=2000',
      '"reports";r=0;t=3000',
    ]);
    expect(JSON.parse(answers[0]!.text)).toMatchObject({ path: '/api/reports/1' });
    for (const over of answers.slice(3)) {
      expect(over.headers.get('content-type')).toBe('application/problem+json');
      expect(Number(over.headers.get('retry-after'))).toBeGreaterThanOrEqual(999);
      expect(over.headers.get('ratelimit')).toMatch(/^"reports";r=0;t=\d+$/);
      expect(over.headers.get('ratelimit-policy')).toBe('"reports";q=3;w=3000');
      expect(JSON.parse(over.text)).toEqual({
        type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
        title: 'Too Many Requests',
        status: 429,
        code: 'RATE_LIMITED',
      });
    }
    expect(nginx.errorLog()).not.toMatch(/auth request unexpected status/);
  });

  it('the identity is the nginx user: the client cannot rotate ids, spend a victim quota or set its cost', async () => {
    const bob = USERS[1]!;
    const victim = USERS[2]!;
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await get('/api/reports/2', bob, {
        'x-tenant-id': `tenant-${i}`,
        'x-quota-subject': `user:${victim}`,
        'x-quota-cost': '0.001',
        'x-quota-policy': 'search',
        'x-forwarded-for': '203.0.113.9',
      });
      statuses.push(res.status);
    }
    expect(statuses).toEqual([200, 200, 200, 429]);
    // Bob's own bucket took the three grants (micro-tokens: under one token is left).
    expect(Number(await redis.hget(bucketKey(1, `user:${bob}`, 'reports'), 'tk'))).toBeLessThan(1_000_000);
    expect(await redis.exists(bucketKey(1, `user:${victim}`, 'reports'))).toBe(0);
    // The victim still has the whole bucket.
    expect((await get('/api/reports/2', victim)).headers.get('ratelimit')).toBe('"reports";r=2;t=1000');
  });

  it('each route has its own policy and cost', async () => {
    const res = await get('/api/search?q=x', USERS[0]!);
    expect(res.status).toBe(200);
    expect(res.headers.get('ratelimit')).toBe('"search";r=8;t=2000');
    expect(res.headers.get('ratelimit-policy')).toBe('"search";q=10;w=10000');
  });

  it('an identity the agent refuses as a subject is a 400 problem', async () => {
    const res = await get('/api/reports/3', BAD_USER);
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text)).toMatchObject({ status: 400, code: 'AGT_ERR_INVALID_SUBJECT' });
  });

  it('with Redis frozen, the fail-closed policy answers 503 with Retry-After and the fail-open one passes', async () => {
    const dave = USERS[3]!;
    await redisServer.pause();
    try {
      const closed = await get('/api/reports/4', dave);
      expect(closed.status).toBe(503);
      expect(closed.headers.get('retry-after')).toBe('1');
      expect(JSON.parse(closed.text)).toMatchObject({ status: 503, code: 'LIMITER_UNAVAILABLE' });
      const open = await get('/api/search?q=y', dave);
      expect(open.status).toBe(200);
      expect(JSON.parse(open.text)).toMatchObject({ path: '/api/search?q=y' });
    } finally {
      await redisServer.resume();
    }
    expect(nginx.errorLog()).not.toMatch(/auth request unexpected status/);
  });

  it('with the agent stopped, nginx applies each route failure mode itself', async () => {
    await agent.close();
    const erin = USERS[4]!;
    const closed = await get('/api/reports/5', erin);
    expect(closed.status).toBe(503);
    expect(closed.headers.get('retry-after')).toBe('1');
    expect(JSON.parse(closed.text)).toMatchObject({ code: 'LIMITER_UNAVAILABLE' });
    const open = await get('/api/search?q=z', erin);
    expect(open.status).toBe(200);
    expect(open.headers.get('ratelimit')).toBeNull();
  });
});
