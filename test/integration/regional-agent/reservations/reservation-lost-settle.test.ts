/**
 * A commit, a cancel or the sweep's expiry whose settle script ran in Redis but whose answer was lost (a store
 * timeout): the state moved, so a retry only replays, yet nothing was refunded. The unused part must still come
 * back, exactly once. The bucket holds 100 tokens and refills 1e-4/s: every token a test sees is a refund.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { RedisReservationStore } from '../../../../regional-agent/redis/reservation-store.js';
import type { ReservationStore } from '../../../../regional-agent/reservations/reservation-store.js';
import { WireTimeoutError } from '../../../../regional-agent/resilience/wire-timeout.js';
import type { RedisServer } from '../../../harness/backend.js';
import { backend, uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [parsePolicy({ name: 'tokens', capacity: 100, refillPerSecond: 1e-4, maxCost: 100 })];

async function call(f: AgentFixture, method: 'POST' | 'DELETE', url: string, payload?: object) {
  const res = await f.app.inject({ method, url, ...(payload === undefined ? {} : { payload }) });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

/** Tokens the bucket holds now (a dry run). */
async function tokens(f: AgentFixture, subject: string): Promise<number> {
  const r = await call(f, 'POST', '/v1/decisions', { policy: 'tokens', subject, dryRun: true });
  const result = (r.body['results'] as { remaining: number }[])[0]!;
  return r.body['allowed'] === true ? result.remaining + 1 : result.remaining;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('a settlement whose answer was lost still refunds, once', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await backend().startRedis();
  });
  afterAll(async () => {
    await server[Symbol.asyncDispose]();
  });

  /** The real store; the next settles of the actions listed run in Redis and then lose their answer. */
  async function lossyAgent() {
    const redis = new Redis(server.url);
    redis.on('error', () => undefined);
    const inner = new RedisReservationStore(redis, { timeoutMs: 2000 });
    const lose: string[] = [];
    const store: ReservationStore = {
      create: (...a) => inner.create(...a),
      async settle(...a: Parameters<ReservationStore['settle']>) {
        const outcome = await inner.settle(...a);
        const i = lose.indexOf(a[1]);
        if (i >= 0) {
          lose.splice(i, 1);
          throw new WireTimeoutError('reservation settle script', 100);
        }
        return outcome;
      },
      index: (...a) => inner.index(...a),
      due: (...a) => inner.due(...a),
      unindex: (...a) => inner.unindex(...a),
    };
    const f = await agentFixture({
      policies,
      redis: { client: redis },
      config: { reservationSweepMs: 0 },
      deps: { reservations: store },
    });
    return {
      f,
      lose,
      async [Symbol.asyncDispose]() {
        await f[Symbol.asyncDispose]();
        redis.disconnect();
      },
    };
  }

  it('commit 12 of 30, its answer lost: 503; the retry replays; 18 come back (not 0), once', async () => {
    await using t = await lossyAgent();
    const subject = uniquePrefix('lost-commit');
    const r = await call(t.f, 'POST', '/v1/reservations', { policy: 'tokens', subject, amount: 30 });
    const id = (r.body['reservation'] as { id: string }).id;
    expect(await tokens(t.f, subject)).toBe(70);
    t.lose.push('commit');
    const first = await call(t.f, 'POST', `/v1/reservations/${id}/commit`, { amount: 12 });
    expect(first.status).toBe(503);
    const retry = await call(t.f, 'POST', `/v1/reservations/${id}/commit`, { amount: 12 });
    expect(retry.body).toMatchObject({ state: 'committed', refunded: 18, replayed: true });
    await t.f.agent.reservations.sweep();
    await t.f.agent.reservations.sweep();
    expect(await tokens(t.f, subject)).toBe(88);
    expect(await t.f.metric(/quotaplane_reservations_total\{outcome="committed"\} (\d+)/)).toBe(1);
  });

  it('cancel of 40, its answer lost: the 40 come back, once', async () => {
    await using t = await lossyAgent();
    const subject = uniquePrefix('lost-cancel');
    const r = await call(t.f, 'POST', '/v1/reservations', { policy: 'tokens', subject, amount: 40 });
    const id = (r.body['reservation'] as { id: string }).id;
    t.lose.push('cancel');
    expect((await call(t.f, 'DELETE', `/v1/reservations/${id}`)).status).toBe(503);
    expect((await call(t.f, 'DELETE', `/v1/reservations/${id}`)).body).toMatchObject({ replayed: true });
    await t.f.agent.reservations.sweep();
    await t.f.agent.reservations.sweep();
    expect(await tokens(t.f, subject)).toBe(100);
  });

  it("the sweep's expiry, its answer lost: the reservation is still refunded whole, once", async () => {
    await using t = await lossyAgent();
    const subject = uniquePrefix('lost-expire');
    await call(t.f, 'POST', '/v1/reservations', { policy: 'tokens', subject, amount: 25, ttlSeconds: 1 });
    expect(await tokens(t.f, subject)).toBe(75);
    await sleep(1100);
    t.lose.push('expire');
    await t.f.agent.reservations.sweep().catch(() => undefined);
    await t.f.agent.reservations.sweep();
    await t.f.agent.reservations.sweep();
    expect(await tokens(t.f, subject)).toBe(100);
    expect(await t.f.metric(/quotaplane_reservations_total\{outcome="expired"\} (\d+)/)).toBe(1);
  });
});
