/**
 * The agent's `quotaplane-answer-within-ms` header against a strict policy's home that has not answered yet, on
 * real NATS and Redis: with no `roundTrips` configured, a forward to a home not measured yet waits the decision
 * deadline plus the allowance of an unmeasured link (250 + 1.25 × 250 = 563 ms). The header must promise that
 * from the agent's first answer on, or `@quotaplane/client` lowers its timeout below it (to 300 ms), gives up on
 * whole batches whose other decisions the agent already charged, and opens its breaker after five of them.
 *
 * In the wall-clock tier (vitest.config.ts), with servers of its own: the client waits the header plus 50 ms, and
 * the agent answers a silent home about 5-20 ms after the header's bound, in this same process; beside another
 * file's burst on the two cores, one run in five lost an exchange to the client's timeout.
 */
import { randomUUID } from 'node:crypto';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { ANSWER_WITHIN_HEADER } from '../../../../core/wire/agent.js';
import { strictSubject } from '../../../../core/wire/strict.js';
import { AgentClient } from '../../../../packages/client/src/agent-client.js';
import { NatsForwarder } from '../../../../regional-agent/strict/nats-forwarder.js';
import type { NatsServer, RedisServer } from '../../../harness/backend.js';
import { backend, uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture } from '../../../helpers/agent-fixture.js';

/** Capacity 100, next to no refill: exact counts for the length of the test. */
const pay = parsePolicy({
  name: 'pay',
  mode: 'strict',
  homeRegion: 'us',
  capacity: 100,
  refillPerSecond: 1e-4,
});
const loc = parsePolicy({ name: 'loc', mode: 'local', capacity: 100, refillPerSecond: 1e-4 });
/** Strict, but homed in the agent's own region: decided here, never forwarded. */
const own = parsePolicy({
  name: 'own',
  mode: 'strict',
  homeRegion: 'eu',
  capacity: 100,
  refillPerSecond: 1e-4,
});

/** The agent's deadline (the default), and what a link not measured yet is allowed: ceil(1.25 × 250). */
const DEADLINE_MS = 250;
const UNMEASURED_ALLOWANCE_MS = 313;

describe('strict: the answer-within header covers a home not measured yet', () => {
  let natsServer: NatsServer;
  let redis: RedisServer;
  let nc: NatsConnection;
  let home: NatsConnection;
  let namespace: string;

  beforeAll(async () => {
    [natsServer, redis] = await Promise.all([backend().startNats(), backend().startRedis()]);
  }, 30_000);

  afterAll(async () => {
    await natsServer?.[Symbol.asyncDispose]();
    await redis?.[Symbol.asyncDispose]();
  });

  beforeEach(async () => {
    namespace = `aw${randomUUID().slice(0, 8)}`;
    nc = await connect({ servers: natsServer.url });
    // The home region's queue group, there and silent: every forwarded request times out (never "no responders").
    home = await connect({ servers: natsServer.url });
    const { subject, queue } = strictSubject(namespace, 'us');
    home.subscribe(subject, { queue, callback: () => undefined });
    await home.flush();
  });

  afterEach(async () => {
    await nc.close();
    await home.close();
  });

  async function headerOf(url: string, body: unknown): Promise<string | null> {
    const res = await fetch(`${url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    await res.arrayBuffer();
    return res.headers.get(ANSWER_WITHIN_HEADER);
  }

  it("promises the unmeasured link from the first answer, so the client waits out a silent home's answer", async () => {
    const forwarder = new NatsForwarder({ nc, region: 'eu', namespace });
    await using eu = await agentFixture({
      policies: [pay, loc],
      config: { region: 'eu', decisionDeadlineMs: DEADLINE_MS, storeTimeoutMs: 100 },
      redis: { server: redis },
      deps: { forwarder },
      listen: true,
    });
    const s = uniquePrefix('aw');
    // Before any strict check was forwarded, a regional decision's answer already promises the home's wait. (Soft,
    // as is the timeout below: without the promise the exchanges that follow show what it costs.)
    expect
      .soft(await headerOf(eu.url, { policy: 'loc', subject: s, dryRun: true }))
      .toBe(String(DEADLINE_MS + UNMEASURED_ALLOWANCE_MS));

    const client = new AgentClient({ baseUrl: eu.url });
    try {
      const warm = await client.decide({ policy: 'loc', subject: s });
      expect(warm.allowed).toBe(true);
      expect(warm.results[0]!.remaining).toBe(99);
      // The header plus the client's 50 ms: 613 (it was 300 when the header said 250).
      expect.soft(client.stats().timeoutMs).toBe(DEADLINE_MS + UNMEASURED_ALLOWANCE_MS + 50);

      // A regional and a strict decision in one exchange: the agent answers both (the strict one after the
      // home's whole wait), and the client takes the agent's answers, not a timeout's.
      const [regional, strict] = await Promise.all([
        client.decide({ policy: 'loc', subject: s }),
        client.decide({ policy: 'pay', subject: s }),
      ]);
      expect(client.stats().batches).toBe(1);
      expect(regional.failure).toBeUndefined();
      expect(regional.degraded).toBeUndefined();
      expect(regional.allowed).toBe(true);
      expect(regional.results[0]).toMatchObject({ policy: 'loc', allowed: true, remaining: 98 });
      expect(strict.failure).toBeUndefined();
      expect(strict.degraded).toBeUndefined();
      expect(strict.allowed).toBe(false);
      expect(strict.results[0]).toMatchObject({ policy: 'pay', allowed: false, reason: 'home_unreachable' });

      // Five more against the silent home: each the agent's home_unreachable, none a timeout; the breaker stays
      // closed and regional decisions keep being the agent's.
      for (let i = 0; i < 5; i++) {
        const again = await client.decide({ policy: 'pay', subject: s });
        expect(again.failure).toBeUndefined();
        expect(again.results[0]!.reason).toBe('home_unreachable');
      }
      const after = await client.decide({ policy: 'loc', subject: s });
      expect(after.failure).toBeUndefined();
      expect(after.results[0]!.remaining).toBe(97);
      const stats = client.stats();
      expect(stats.breaker).toBe('closed');
      expect(stats.failures.timeout).toBe(0);
      expect(stats.degraded).toEqual({ fail_open: 0, fail_closed: 0, fallback: 0 });
      expect(stats.timeoutMs).toBe(DEADLINE_MS + UNMEASURED_ALLOWANCE_MS + 50);
    } finally {
      client.close();
    }
    // The home never answered: still not measured, still promised.
    expect(forwarder.farthestAllowanceMs()).toBe(UNMEASURED_ALLOWANCE_MS);
  }, 30_000);

  it('promises the deadline alone when no strict policy is homed in another region', async () => {
    const forwarder = new NatsForwarder({ nc, region: 'eu', namespace });
    await using eu = await agentFixture({
      policies: [loc, own],
      config: { region: 'eu', decisionDeadlineMs: DEADLINE_MS, storeTimeoutMs: 100 },
      redis: { server: redis },
      deps: { forwarder },
      listen: true,
    });
    const s = uniquePrefix('aw');
    expect(await headerOf(eu.url, { policy: 'loc', subject: s })).toBe(String(DEADLINE_MS));
    expect(await headerOf(eu.url, { policy: 'own', subject: s })).toBe(String(DEADLINE_MS));
    const client = new AgentClient({ baseUrl: eu.url });
    try {
      expect((await client.decide({ policy: 'own', subject: s })).results[0]).toMatchObject({
        allowed: true,
        remaining: 98,
      });
      expect(client.stats().timeoutMs).toBe(300);
    } finally {
      client.close();
    }
  }, 30_000);
});
