/**
 * What a protected route answers for a caller's bad input when nothing else is wrong, and when the agent cannot
 * be reached (the failure modes answer only what the agent could have decided): a 400 with the agent's own code,
 * never a 500, never a failure-mode answer. The agent here is a port nobody listens on.
 */
import { createServer } from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError } from '../../src/agent-client.js';
import { quotaplane } from '../../src/fastify.js';

let client: AgentClient;
let app: FastifyInstance;
const refused: AgentRequestError[] = [];

/** A loopback port that was free a moment ago: connecting to it is refused. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

beforeAll(async () => {
  client = new AgentClient({
    baseUrl: `http://127.0.0.1:${await closedPort()}`,
    onUnavailable: 'local',
    fallback: { capacity: 5, refillPerSecond: 1 },
  });
  app = Fastify();
  await app.register(quotaplane, {
    client,
    subject: (request) => (request.query as Record<string, string | undefined>)['t'],
    onRefused: (error) => refused.push(error),
  });
  app.get(
    '/work',
    { config: { quota: { policy: 'work', cost: (request) => Number(request.headers['x-cost'] ?? 1) } } },
    () => ({ ok: true }),
  );
});

afterAll(async () => {
  await app.close();
  client.close();
});

describe("a caller's bad input is its 400, also while the agent cannot be reached", () => {
  it('a subject that is not one text of at most 1,024 characters: 400 AGT_ERR_INVALID_SUBJECT, no call', async () => {
    const exchanges = client.stats().exchanges;
    for (const query of ['t=a&t=b', `t=${'x'.repeat(1025)}`]) {
      const res = await app.inject({ url: `/work?${query}` });
      expect(res.statusCode, query.slice(0, 20)).toBe(400);
      expect(res.json()).toMatchObject({
        code: 'AGT_ERR_INVALID_SUBJECT',
        detail: 'the subject of this request is not valid',
      });
    }
    expect(client.stats().exchanges).toBe(exchanges);
    expect(refused).toEqual([]);
  });

  it('a subject no agent keys (control characters, a lone surrogate): 400 AGT_ERR_INVALID_SUBJECT, nothing charged', async () => {
    const before = client.stats().refused['AGT_ERR_INVALID_SUBJECT'] ?? 0;
    for (const subject of ['a\tb', 'a\u0000b', 'x\ud800y', 'a\u007fb', 'b\u0085']) {
      await expect(
        client.decide({ policy: 'subjects', subject }),
        JSON.stringify(subject),
      ).rejects.toMatchObject({
        status: 400,
        code: 'AGT_ERR_INVALID_SUBJECT',
      });
    }
    // Through the plugin too (the agent cannot be reached: without the check the fallback bucket admitted them).
    const res = await app.inject({ url: `/work?t=${encodeURIComponent('a\tb')}` });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'AGT_ERR_INVALID_SUBJECT' });
    expect(client.stats().refused['AGT_ERR_INVALID_SUBJECT']).toBe(before + 6);
    // An emoji pair and U+FFFD are text an agent with a secret keys: the failure mode decides them.
    for (const subject of ['a\ud83d\ude00', 'a\ufffd']) {
      const d = await client.decide({ policy: 'subjects', subject });
      expect(d.results[0], JSON.stringify(subject)).toMatchObject({ reason: 'emergency_bucket' });
    }
  });

  it("a cost the agent would refuse is refused as it would, not decided by the fallback's failure mode", async () => {
    for (const cost of ['NaN', '-5', '0', '1e12', 'abc']) {
      const res = await app.inject({ url: '/work?t=tenant-1', headers: { 'x-cost': cost } });
      expect(res.statusCode, cost).toBe(400);
      expect(res.json(), cost).toMatchObject({ code: 'AGT_ERR_INVALID_COST' });
    }
    // The agent was asked each time (its port refused the connection): only then does the client read the body.
    // (The six subjects refused by the test before this one are counted too.)
    expect(client.stats().refused).toEqual({ AGT_ERR_INVALID_COST: 5, AGT_ERR_INVALID_SUBJECT: 6 });
    expect(refused).toEqual([]);
    // A valid cost is decided by the failure mode: the fallback bucket of 5, charged 2.
    const ok = await app.inject({ url: '/work?t=tenant-1', headers: { 'x-cost': '2' } });
    expect(ok.statusCode).toBe(200);
    const decision = await client.decide({ policy: 'work', subject: 'tenant-1', cost: 4 });
    expect(decision.allowed).toBe(false);
    expect(decision.results[0]).toMatchObject({ reason: 'emergency_bucket', remaining: 3 });
  });

  it('decide() and failureDecision() reject such a body with the agent error, counted as refused', async () => {
    await expect(
      client.decide({ policy: 'work', subject: 'tenant-2', cost: Number.NaN }),
    ).rejects.toMatchObject({
      name: 'AgentRequestError',
      status: 400,
      code: 'AGT_ERR_INVALID_COST',
    });
    expect(client.stats().refused['AGT_ERR_INVALID_COST']).toBe(6);
    // What the agent would read is the JSON: a key set to undefined is not sent, so the body is one it decides.
    const kept = await client.decide({ policy: 'work', subject: 'tenant-3', extra: undefined } as never);
    expect(kept.results[0]).toMatchObject({ reason: 'emergency_bucket' });
    expect(client.stats().refused['AGT_ERR_INVALID_COST']).toBe(6);
    expect(() =>
      client.failureDecision(
        { policy: 'work', subject: '' },
        new (class extends Error {})() as unknown as Parameters<AgentClient['failureDecision']>[1],
      ),
    ).toThrow(AgentRequestError);
  });
});

describe('a closed client', () => {
  it('sheds every decision, breaker or not: answered by the failure mode, never sent, never an agent failure', async () => {
    for (const breaker of [undefined, false] as const) {
      const failures: unknown[] = [];
      const closed = new AgentClient({
        baseUrl: `http://127.0.0.1:${await closedPort()}`,
        onFailure: (error) => failures.push(error),
        ...(breaker === undefined ? {} : { breaker }),
      });
      closed.close();
      const d = await closed.decide({ policy: 'work', subject: 'tenant-1' });
      expect(d).toMatchObject({ allowed: false, degraded: 'fail_closed', failure: 'shed' });
      expect(d.results[0]).toMatchObject({ reason: 'client_shed' });
      const stats = closed.stats();
      expect(stats).toMatchObject({ shed: 1, exchanges: 0, connections: 0 });
      expect(Object.values(stats.failures).every((n) => n === 0)).toBe(true);
      expect(failures).toEqual([]);
    }
  });
});
