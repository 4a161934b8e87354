/**
 * A decision the agent sheds inside a coalesced batch (`POST /v1/decisions/batch`, 503 AGT_ERR_OVERLOADED in its
 * element's place) is answered with the agent's own retry hint, as a shed single decision is: the element's
 * `retryAfter` (QP_OVERLOAD_RETRY_AFTER_MS, here 10 s), not the client's `unavailableRetryAfterMs` (1 s). Through
 * the client (the decision's `retryAfterMs`) and through the Fastify plugin (its 503's `Retry-After`), for a shed
 * at the agent's admission control and one at a strict policy's home region.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { HomeOverloadedError } from '../../../../regional-agent/decisions/forwarder.js';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../../test/helpers/agent-fixture.js';
import { AgentClient } from '../../src/agent-client.js';
import { quotaplane } from '../../src/fastify.js';

let agent: AgentFixture;
let client: AgentClient;
let service: FastifyInstance;

beforeAll(async () => {
  agent = await agentFixture({
    policies: [
      parsePolicy({ name: 'work', capacity: 1000, refillPerSecond: 100 }),
      parsePolicy({ name: 'away', capacity: 1000, refillPerSecond: 100, mode: 'strict', homeRegion: 'eu' }),
    ],
    config: { maxInFlight: 2, overloadRetryAfterMs: 10_000, reservationSweepMs: 0 },
    deps: {
      // A home region that sheds every forwarded request (its admission control refused it).
      forwarder: {
        decide: (home) =>
          Promise.reject(new HomeOverloadedError(home, 'home_admission', `home region ${home}: busy`)),
      },
    },
    listen: true,
  });
  // Coalescing on (the default); grants off, so every decision is the agent's.
  client = new AgentClient({ baseUrl: agent.url, timeoutMs: 5000, grants: false });
  service = Fastify();
  await service.register(quotaplane, {
    client,
    subject: (request) => request.headers['x-tenant-id'] as string | undefined,
  });
  service.get('/work', { config: { quota: { policy: 'work' } } }, () => ({ ran: true }));
}, 30_000);

afterAll(async () => {
  await service?.close();
  client?.close();
  await agent?.[Symbol.asyncDispose]();
});

describe('a decision shed inside a batch', () => {
  it("the plugin's 503 says Retry-After: 10, the agent's, as for a shed single decision", async () => {
    const tenant = uniquePrefix('crowd');
    const batches = client.stats().batches;
    const answers = await Promise.all(
      Array.from({ length: 8 }, () => service.inject({ url: '/work', headers: { 'x-tenant-id': tenant } })),
    );
    expect(client.stats().batches).toBeGreaterThan(batches);
    const statuses = answers.map((a) => a.statusCode);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(2);
    const shed = answers.filter((a) => a.statusCode === 503);
    expect(shed.length, String(statuses)).toBeGreaterThan(0);
    for (const a of shed) expect(a.headers['retry-after']).toBe('10');
    expect(statuses.every((s) => s === 200 || s === 503)).toBe(true);
  });

  it("the client's decisions carry the agent's hint: admission here and a strict policy's home", async () => {
    const tenant = uniquePrefix('direct');
    // The strict check first: admitted with the batch, it is shed by its home; of the others, one is admitted and
    // the rest are shed by admission control.
    const decisions = await Promise.all([
      client.check('away', tenant),
      ...Array.from({ length: 6 }, () => client.check('work', tenant)),
    ]);
    const shed = decisions.filter((d) => d.failure === 'overloaded');
    expect(shed.length).toBeGreaterThanOrEqual(5);
    for (const d of shed)
      expect(d).toMatchObject({
        allowed: false,
        degraded: 'fail_closed',
        retryAfterMs: 10_000,
        headers: { 'Retry-After': '10' },
      });
    expect(decisions[0]).toMatchObject({ failure: 'overloaded', retryAfterMs: 10_000 });
    // The strict check was shed by its home, not at the door.
    expect(
      await agent.metric(/quotaplane_shed_after_admission_total\{[^}]*path="home_admission"[^}]*\} (\d+)/),
    ).toBe(1);
  });
});
