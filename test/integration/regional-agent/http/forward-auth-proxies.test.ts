/**
 * Forward-auth behind Traefik's ForwardAuth and Envoy's ext_authz (HTTP), by contract: neither binary can be
 * installed here, so models of their documented semantics (test/helpers/proxy-models/) run the very
 * configurations docs/proxies.md shows, in front of a real agent on a Redis this test owns.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import type { RedisServer } from '../../../harness/backend.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { docBlock, substitute } from '../../../helpers/doc-blocks.js';
import { startEnvoyModel } from '../../../helpers/proxy-models/envoy-model.js';
import type { ModelServer } from '../../../helpers/proxy-models/model-server.js';
import { startTraefikModel } from '../../../helpers/proxy-models/traefik-forward-auth.js';
import { within } from '../../../helpers/within.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const traefikBlock = docBlock('proxies.md', 'forward-auth-traefik');
const envoyBlock = docBlock('proxies.md', 'forward-auth-envoy');
const SECRET = 'replace-with-QP_FORWARD_AUTH_SECRET';

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
/** What the service was sent, by path. */
const seen = new Map<string, Record<string, unknown>>();
let traefik: ModelServer;
let envoy: ModelServer;
const run = uniquePrefix('p').replace(/[^a-z0-9]/g, '');
const name = (n: string) => `${n}${run}`;
const users: Record<string, string> = Object.fromEntries(
  ['alice', 'bob', 'carol', 'dave', 'bad*x'].map((n) => [name(n), `pw-${n}`]),
);

beforeAll(async () => {
  expect(traefikBlock).toContain(SECRET);
  expect(envoyBlock).toContain(SECRET);
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
  const agentPort = new URL(fixture.url).port;
  service = createServer((req, res) => {
    seen.set(req.url ?? '', req.headers);
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ path: req.url }));
  });
  await new Promise<void>((resolve) => service.listen(0, '127.0.0.1', resolve));
  const servicePort = String((service.address() as AddressInfo).port);

  traefik = await startTraefikModel(
    parseYaml(
      substitute(traefikBlock, {
        'http://127.0.0.1:7101': `http://127.0.0.1:${agentPort}`,
        'http://127.0.0.1:8080': `http://127.0.0.1:${servicePort}`,
      }),
    ),
    users,
  );
  envoy = await startEnvoyModel(
    parseYaml(
      substitute(envoyBlock, {
        'port_value: 7101': `port_value: ${agentPort}`,
        'port_value: 8080': `port_value: ${servicePort}`,
      }),
    ),
  );
});

afterAll(async () => {
  await traefik?.[Symbol.asyncDispose]();
  await envoy?.[Symbol.asyncDispose]();
  await new Promise((resolve) => service?.close(resolve));
  await fixture?.[Symbol.asyncDispose]();
});

/** A JWT as Envoy's jwt_authn would have verified it (the model does not check signatures). */
const jwt = (sub: string) =>
  ['{"alg":"none"}', JSON.stringify({ iss: 'https://auth.example.com', sub })]
    .map((part) => Buffer.from(part).toString('base64url'))
    .join('.') + '.sig';

interface Proxy {
  label: string;
  url: () => string;
  /** The credentials of `user` in this proxy's scheme. */
  auth: (user: string) => string;
  /** The subject the agent sees for `user`. */
  subject: (user: string) => string;
}

const proxies: Proxy[] = [
  {
    label: 'Traefik ForwardAuth',
    url: () => traefik.url,
    auth: (u) => `Basic ${Buffer.from(`${u}:${users[u]}`).toString('base64')}`,
    subject: (u) => u,
  },
  {
    label: 'Envoy ext_authz',
    url: () => envoy.url,
    auth: (u) => `Bearer ${jwt(`user:${u}`)}`,
    subject: (u) => `user:${u}`,
  },
];

describe.each(proxies)('forward-auth behind $label, configured as docs/proxies.md says', (proxy) => {
  const get = async (path: string, user: string, headers: Record<string, string> = {}) => {
    const res = await fetch(`${proxy.url()}${path}`, {
      headers: { authorization: proxy.auth(user), ...headers },
    });
    return { status: res.status, headers: res.headers, text: await res.text() };
  };
  const tag = proxy.label.split(' ')[0]!.toLowerCase();

  it('lets requests through within quota, then answers 429 with Retry-After, the headers and the problem', async () => {
    const alice = name('alice');
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push(await get(`/api/reports/${tag}-${i}`, alice));
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 429, 429]);
    // Envoy adds the agent's headers to the client's response; Traefik to the request the service gets.
    const first =
      tag === 'envoy'
        ? answers[0]!.headers.get('ratelimit')
        : seen.get(`/api/reports/${tag}-0`)?.['ratelimit'];
    expect(first).toBe('"reports";r=2;t=1000');
    for (const over of answers.slice(3)) {
      expect(over.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(Number(over.headers.get('retry-after'))).toBeGreaterThanOrEqual(999);
      expect(over.headers.get('ratelimit')).toMatch(/^"reports";r=0;t=\d+$/);
      expect(over.headers.get('ratelimit-policy')).toBe('"reports";q=3;w=3000');
      expect(JSON.parse(over.text)).toMatchObject({
        status: 429,
        code: 'RATE_LIMITED',
        'violated-policies': ['reports'],
      });
    }
  });

  it('the identity is the one the proxy authenticated; client-sent X-Quota-* never reach the agent', async () => {
    const bob = name('bob');
    const victim = name('carol');
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await get(`/api/reports/${tag}-b${i}`, bob, {
        'x-tenant-id': `t-${i}`,
        'x-quota-subject': proxy.subject(victim),
        'x-quota-cost': '0.001',
        'x-quota-policy': 'search',
        'x-quota-secret': 'guessed-secret-of-the-client',
      });
      statuses.push(res.status);
    }
    expect(statuses).toEqual([200, 200, 200, 429]);
    expect(await redis.exists(bucketKey(1, proxy.subject(victim), 'reports'))).toBe(0);
    // The service never sees the shared secret.
    expect(seen.get(`/api/reports/${tag}-b0`)?.['x-quota-secret']).toBeUndefined();
  });

  it('each route has its own policy and cost', async () => {
    const res = await get(`/api/search?${tag}`, name('alice'));
    expect(res.status).toBe(200);
    const rl = tag === 'envoy' ? res.headers.get('ratelimit') : seen.get(`/api/search?${tag}`)?.['ratelimit'];
    expect(rl).toBe('"search";r=8;t=2000');
  });

  it('an identity the agent refuses is a 400 problem', async () => {
    const res = await get(`/api/reports/${tag}-bad`, name('bad*x'));
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text)).toMatchObject({ code: 'AGT_ERR_INVALID_SUBJECT' });
  });

  it('with Redis frozen, the fail-closed policy answers 503 and the fail-open one lets requests through', async () => {
    const dave = name('dave');
    await redisServer.pause();
    try {
      const closed = await get(`/api/reports/${tag}-frozen`, dave);
      expect(closed.status).toBe(503);
      if (tag === 'traefik') {
        // Traefik returns the agent's answer as it is.
        expect(closed.headers.get('retry-after')).toBe('1');
        expect(JSON.parse(closed.text)).toMatchObject({ code: 'LIMITER_UNAVAILABLE' });
      } else {
        // Envoy answers any 5xx of the auth server with status_on_error, without its headers or body.
        expect(closed.headers.get('retry-after')).toBeNull();
        expect(closed.text).toBe('');
      }
      const open = await get(`/api/search?frozen-${tag}`, dave);
      expect(open.status).toBe(200);
    } finally {
      await redisServer.resume();
    }
  });
});

describe('with the agent stopped', () => {
  // Each step has its own bound (a busy machine once ran the whole test into its 20 s timeout, saying nothing of
  // which step was slow): the models give up on the agent after their own timeouts, well within these.
  it('Traefik answers 500 and Envoy its status_on_error (503), both closed', async () => {
    await within(agent.close(), 15_000, 'the agent closes');
    const t = await fetch(`${traefik.url}/api/search?down`, {
      headers: { authorization: proxies[0]!.auth(name('alice')) },
      signal: AbortSignal.timeout(15_000),
    });
    const e = await fetch(`${envoy.url}/api/search?down`, {
      headers: { authorization: proxies[1]!.auth(name('alice')) },
      signal: AbortSignal.timeout(15_000),
    });
    expect([t.status, e.status]).toEqual([500, 503]);
  }, 60_000);
});
