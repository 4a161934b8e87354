/**
 * Subject classes and idempotency keys through the Fastify plugin, against a real agent and Redis: a class read
 * from the request gets its own limits, a retry with the same idempotency key is charged once, and what the
 * caller gets wrong in either is the caller's 400 (nothing asked, nothing charged), while a fixed class the
 * policy lacks is the configuration's 500.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, type AgentRequestError } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import { parsePoliciesFile } from '../../../../regional-agent/policies/file-policy-source.js';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../../test/helpers/agent-fixture.js';

const policies = parsePoliciesFile(
  'policies.json',
  JSON.stringify({
    policies: {
      plans: {
        capacity: 2,
        refillPerSecond: 0.001,
        classes: { pro: { capacity: 5, refillPerSecond: 0.001 } },
      },
      writes: { capacity: 3, refillPerSecond: 0.001, maxCost: 2 },
      running: { kind: 'concurrency', capacity: 2, leaseSeconds: 60 },
      costly: {
        capacity: 10,
        refillPerSecond: 0.001,
        maxCost: 5,
        classes: { free: { capacity: 10, refillPerSecond: 0.001, maxCost: 2 } },
      },
    },
  }),
);

let agent: AgentFixture;
/** Requests of `/run?wait=1` that reached the handler, and what they wait for. */
let entered = 0;
let letGo: () => void = () => undefined;
let held = Promise.resolve();
let client: AgentClient;
let service: FastifyInstance;
const refused: AgentRequestError[] = [];

beforeAll(async () => {
  agent = await agentFixture({ policies: [...policies.values()], listen: true });
  // The client's defaults (grants on): a check with a class or a key is never decided on a grant.
  client = new AgentClient({ baseUrl: agent.url, timeoutMs: 2000 });
  service = Fastify();
  await service.register(quotaplane, {
    client,
    subject: (request) => request.headers['x-tenant-id'] as string | undefined,
    idempotencyKey: (request) => request.headers['idempotency-key'],
    onRefused: (error) => refused.push(error),
  });
  const plan = (request: { headers: Record<string, string | string[] | undefined> }) =>
    request.headers['x-plan'];
  service.get('/plan', { config: { quota: { policy: 'plans', class: plan } } }, () => ({ ran: true }));
  service.get('/gold', { config: { quota: { policy: 'plans', class: 'gold' } } }, () => ({ ran: true }));
  service.post('/writes', { config: { quota: { policy: 'writes' } } }, (request) => ({
    ran: true,
    replayed: request.quotaDecision?.replayed === true,
  }));
  service.post('/writes-too', { config: { quota: { policy: 'writes' } } }, () => ({ ran: true }));
  service.post(
    '/weighted',
    { config: { quota: { policy: 'writes', cost: (request) => Number(request.headers['x-cost']) } } },
    () => ({ ran: true }),
  );
  // Fails when asked to (?fail=1); waits for the test when asked to (?wait=1).
  service.get<{ Querystring: { fail?: string; wait?: string } }>(
    '/run',
    { config: { quota: { policy: 'running' } } },
    async (request) => {
      if (request.query.wait === '1') {
        entered++;
        await held;
      }
      if (request.query.fail === '1') throw new Error('the handler failed');
      return { ran: true };
    },
  );
  service.get('/costly', { config: { quota: { policy: 'costly', cost: 5, class: plan } } }, () => ({
    ran: true,
  }));
  service.post(
    '/both',
    { config: { quota: [{ policy: 'writes' }, { policy: 'plans', class: plan }] } },
    () => ({ ran: true }),
  );
});
afterAll(async () => {
  await service.close();
  client.close();
  await agent[Symbol.asyncDispose]();
});

async function statuses(n: number, request: () => Promise<{ statusCode: number }>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push((await request()).statusCode);
  return out;
}

describe('subject classes through the plugin', () => {
  it("a class read from the request gets the class's limits; no class, the policy's own", async () => {
    const free = uniquePrefix('free');
    const pro = uniquePrefix('pro');
    expect(
      await statuses(4, () => service.inject({ url: '/plan', headers: { 'x-tenant-id': free } })),
    ).toEqual([200, 200, 429, 429]);
    const proAnswers = await statuses(7, () =>
      service.inject({ url: '/plan', headers: { 'x-tenant-id': pro, 'x-plan': 'pro' } }),
    );
    expect(proAnswers).toEqual([200, 200, 200, 200, 200, 429, 429]);
  });

  it("a class the policy lacks is the caller's 400 when read from the request, the configuration's 500 when fixed", async () => {
    const tenant = uniquePrefix('cls');
    const before = client.stats().exchanges;
    // Of the form no policy's class has: refused without asking the agent.
    for (const plan of ['Gold!', '', 'x'.repeat(40)]) {
      const res = await service.inject({ url: '/plan', headers: { 'x-tenant-id': tenant, 'x-plan': plan } });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ code: 'AGT_ERR_UNKNOWN_CLASS' });
    }
    const twice = await service.inject({
      url: '/plan',
      headers: { 'x-tenant-id': tenant, 'x-plan': ['pro', 'pro'] },
    });
    expect(twice.statusCode).toBe(400);
    expect(twice.json()).toMatchObject({ code: 'AGT_ERR_UNKNOWN_CLASS' });
    expect(client.stats().exchanges).toBe(before);
    // Of a class's form, but not one of this policy's: the agent refuses it, and it is still the caller's.
    const gold = await service.inject({ url: '/plan', headers: { 'x-tenant-id': tenant, 'x-plan': 'gold' } });
    expect(gold.statusCode).toBe(400);
    expect(gold.json()).toMatchObject({ code: 'AGT_ERR_UNKNOWN_CLASS' });
    expect(refused).toHaveLength(0);
    // The same class fixed on the route: the service's configuration.
    const fixed = await service.inject({ url: '/gold', headers: { 'x-tenant-id': tenant } });
    expect(fixed.statusCode).toBe(500);
    expect(fixed.json()).toMatchObject({
      code: 'QUOTA_MISCONFIGURED',
      'agent-code': 'AGT_ERR_UNKNOWN_CLASS',
    });
    expect(refused.map((e) => e.code)).toEqual(['AGT_ERR_UNKNOWN_CLASS']);
    refused.length = 0;
    // None of it charged the subject: the policy's two tokens are still there.
    expect(
      await statuses(3, () => service.inject({ url: '/plan', headers: { 'x-tenant-id': tenant } })),
    ).toEqual([200, 200, 429]);
  });
});

describe('idempotency keys through the plugin', () => {
  it('a retry with the same key is answered with the first decision and charged once', async () => {
    const tenant = uniquePrefix('idem');
    const post = (key: string) =>
      service.inject({
        method: 'POST',
        url: '/writes',
        headers: { 'x-tenant-id': tenant, 'idempotency-key': key },
      });
    const first = await post('order-1');
    expect(first.statusCode).toBe(200);
    expect(first.headers['ratelimit']).toBe('"writes";r=2;t=1000');
    expect(await statuses(4, () => post('order-1'))).toEqual([200, 200, 200, 200]);
    // Three tokens: order-1 took one, however often it was retried.
    expect(await statuses(3, () => post(`order-${2 + Math.random()}`))).toEqual([200, 200, 429]);
    // A refusal is not remembered: the same key is decided afresh, and refused again.
    const again = await post('order-refused');
    expect(again.statusCode).toBe(429);
  });

  it('layered checks share the key: a retry replays both and charges neither', async () => {
    const tenant = uniquePrefix('both');
    const post = (key: string) =>
      service.inject({
        method: 'POST',
        url: '/both',
        headers: { 'x-tenant-id': tenant, 'x-plan': 'pro', 'idempotency-key': key },
      });
    expect(await statuses(5, () => post('layered-1'))).toEqual([200, 200, 200, 200, 200]);
    // writes (3) and plans as pro (5): one of each went to layered-1.
    expect(await statuses(3, () => post(`layered-${2 + Math.random()}`))).toEqual([200, 200, 429]);
  });

  it("the key on another request is the caller's 409, and charges nothing", async () => {
    const tenant = uniquePrefix('reuse');
    const weighted = (cost: number) =>
      service.inject({
        method: 'POST',
        url: '/weighted',
        headers: { 'x-tenant-id': tenant, 'x-cost': String(cost), 'idempotency-key': 'order-9' },
      });
    expect((await weighted(1)).statusCode).toBe(200);
    // The same key on the same route for another cost: another request.
    const other = await weighted(2);
    expect(other.statusCode).toBe(409);
    expect(other.json()).toMatchObject({ code: 'AGT_ERR_IDEMPOTENCY_CONFLICT' });
    expect(refused).toHaveLength(0);
    // writes: 1 of 3 taken by order-9; the conflict took nothing.
    expect(
      await statuses(3, () =>
        service.inject({ method: 'POST', url: '/writes', headers: { 'x-tenant-id': tenant } }),
      ),
    ).toEqual([200, 200, 429]);
  });

  it("a key the wire does not take is the caller's 400, and nothing is asked or charged", async () => {
    const tenant = uniquePrefix('badkey');
    const before = client.stats().exchanges;
    for (const key of ['has space', 'x'.repeat(257), 'ünicode', ['a', 'b']]) {
      const res = await service.inject({
        method: 'POST',
        url: '/writes',
        headers: { 'x-tenant-id': tenant, 'idempotency-key': key },
      });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ code: 'INVALID_IDEMPOTENCY_KEY' });
    }
    expect(client.stats().exchanges).toBe(before);
    expect(
      await statuses(4, () =>
        service.inject({ method: 'POST', url: '/writes', headers: { 'x-tenant-id': tenant } }),
      ),
    ).toEqual([200, 200, 200, 429]);
  });
});

describe('concurrency rules through the plugin', () => {
  /** Whether the agent holds none of the subject's two slots (a dry run: nothing taken). */
  const free = async (tenant: string): Promise<boolean> => {
    const res = await fetch(`${agent.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'running', subject: tenant, dryRun: true }),
    });
    // A dry run answers what would be left after it: 1 of 2 when nothing is held.
    return ((await res.json()) as { results: { remaining: number }[] }).results[0]!.remaining === 1;
  };
  const eventually = async (probe: () => Promise<boolean>): Promise<void> => {
    for (let i = 0; i < 100 && !(await probe()); i++) await new Promise((r) => setTimeout(r, 20));
  };

  it('a slot is given back when the response ends, whether the handler answered or threw', async () => {
    const tenant = uniquePrefix('run');
    const answers: number[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await service.inject({
        url: `/run${i % 2 === 1 ? '?fail=1' : ''}`,
        headers: { 'x-tenant-id': tenant },
      });
      answers.push(res.statusCode);
      // Given back as the answer leaves: both slots are free again soon after (before, each stayed held for
      // leaseSeconds, so the third request was a 429).
      await eventually(() => free(tenant));
    }
    expect(answers).toEqual([200, 500, 200, 500, 200, 500]);
    expect(await free(tenant)).toBe(true);
  });

  it('two requests in their handlers hold both slots; a third is refused until one answers', async () => {
    const tenant = uniquePrefix('hold');
    entered = 0;
    held = new Promise((resolve) => (letGo = resolve));
    const slow = [0, 1].map(() => service.inject({ url: '/run?wait=1', headers: { 'x-tenant-id': tenant } }));
    while (entered < 2) await new Promise((r) => setTimeout(r, 5));
    const third = await service.inject({ url: '/run', headers: { 'x-tenant-id': tenant } });
    expect(third.statusCode).toBe(429);
    expect(third.json()).toMatchObject({ 'violated-policies': ['running'] });
    letGo();
    expect((await Promise.all(slow)).map((r) => r.statusCode)).toEqual([200, 200]);
    await eventually(() => free(tenant));
    const after = await service.inject({ url: '/run', headers: { 'x-tenant-id': tenant } });
    expect(after.statusCode).toBe(200);
  });

  it('a slot held by a caller that went away is given back', async () => {
    await service.listen({ port: 0, host: '127.0.0.1' });
    const address = service.server.address() as { port: number };
    const tenant = uniquePrefix('gone');
    entered = 0;
    held = new Promise((resolve) => (letGo = resolve));
    const controller = new AbortController();
    const gone = fetch(`http://127.0.0.1:${address.port}/run?wait=1`, {
      headers: { 'x-tenant-id': tenant },
      signal: controller.signal,
    }).catch(() => 'aborted');
    while (entered < 1) await new Promise((r) => setTimeout(r, 5));
    expect(await free(tenant)).toBe(false);
    controller.abort();
    expect(await gone).toBe('aborted');
    try {
      await eventually(() => free(tenant));
      expect(await free(tenant)).toBe(true);
    } finally {
      letGo();
    }
  });
});

describe('idempotency keys are bound to their route', () => {
  it('one key sent to two routes is two requests; a replay tells the handler', async () => {
    const tenant = uniquePrefix('bound');
    const post = (url: string) =>
      service.inject({ method: 'POST', url, headers: { 'x-tenant-id': tenant, 'idempotency-key': 'same' } });
    const first = await post('/writes');
    expect(first.json()).toEqual({ ran: true, replayed: false });
    expect((await post('/writes')).json()).toEqual({ ran: true, replayed: true });
    // Another route with the same key: decided (and charged) on its own, never the first route's replay. Before,
    // 20 requests alternating two routes with one key were all admitted, charged once.
    expect((await post('/writes-too')).statusCode).toBe(200);
    expect((await post('/writes-too')).statusCode).toBe(200);
    // writes holds 3: one for each route's key, one left.
    expect(
      await statuses(2, () =>
        service.inject({ method: 'POST', url: '/writes', headers: { 'x-tenant-id': tenant } }),
      ),
    ).toEqual([200, 429]);
  });
});

describe('a class read from the request sets the largest cost', () => {
  it("a cost above the caller's class's maxCost is the caller's 400, not the configuration's alert", async () => {
    const tenant = uniquePrefix('costly');
    const ok = await service.inject({ url: '/costly', headers: { 'x-tenant-id': tenant } });
    expect(ok.statusCode).toBe(200);
    const res = await service.inject({
      url: '/costly',
      headers: { 'x-tenant-id': tenant, 'x-plan': 'free' },
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'AGT_ERR_COST_ABOVE_MAX' });
    expect(refused).toHaveLength(0);
  });
});
