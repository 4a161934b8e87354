/**
 * A reservation whose create got no answer in time is refunded exactly once, on a real Redis, whatever comes
 * first: the create landing late, the agent's abort, the sweep, a retried abort. The bucket holds 10 tokens and
 * refills 1e-4/s, so every token a test sees admitted is a token it was given: after a reserve of 5 that answers
 * 503, then the expiry and the sweep, exactly 10 are admitted in all (the reviewer's reproduction found 15).
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { ReservationBody, SettleAction, SettleOutcome } from '../../../../core/models/reservation.js';
import { RedisReservationStore } from '../../../../regional-agent/redis/reservation-store.js';
import type { ReservationStore } from '../../../../regional-agent/reservations/reservation-store.js';
import { WireTimeoutError } from '../../../../regional-agent/resilience/wire-timeout.js';
import type { RedisServer } from '../../../harness/backend.js';
import { backend, uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';
import { replyDelayingProxy } from '../../../helpers/reply-delaying-proxy.js';

const policies = [parsePolicy({ name: 'tokens', capacity: 10, refillPerSecond: 1e-4, maxCost: 10 })];

async function call(f: AgentFixture, method: 'POST' | 'GET', url: string, payload?: object) {
  const res = await f.app.inject({ method, url, ...(payload === undefined ? {} : { payload }) });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

/** Spend one token at a time until refused: how many were admitted. */
async function drain(f: AgentFixture, subject: string): Promise<number> {
  let n = 0;
  for (; n < 100; n++) {
    const r = await call(f, 'POST', '/v1/decisions', { policy: 'tokens', subject });
    if (r.body['allowed'] !== true) break;
  }
  return n;
}

const counted = (f: AgentFixture, outcome: string) =>
  f.metric(new RegExp(`quotaplane_reservations_total\\{outcome="${outcome}"\\} (\\d+)`));

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A reserve of 5 (TTL 1 s) that answers 503: the client is told nothing is held. */
async function reserveUnanswered(f: AgentFixture, subject: string): Promise<void> {
  const r = await call(f, 'POST', '/v1/reservations', {
    policy: 'tokens',
    subject,
    amount: 5,
    ttlSeconds: 1,
  });
  expect(r.status, JSON.stringify(r.body)).toBe(503);
  expect(r.body['code']).toBe('AGT_ERR_STORE_UNAVAILABLE');
}

describe('a reservation whose create answered too late is refunded exactly once', () => {
  // A Redis of this file's own: the sweep index (rl:resv:due) is one per Redis, and another file's sweepers on
  // the shared one would expire these reservations (and these sweeps theirs), muddling both files' counts.
  let server: RedisServer;
  beforeAll(async () => {
    server = await backend().startRedis();
  });
  afterAll(async () => {
    await server[Symbol.asyncDispose]();
  });

  it('the reply of the create comes after the store timeout (a TCP proxy holds it): 10 admitted in all, not 15', async () => {
    await using proxy = await replyDelayingProxy({ host: server.host, port: server.port });
    await using f = await agentFixture({
      policies,
      redis: { target: { redisUrl: proxy.url } },
      config: { storeTimeoutMs: 400, reservationSweepMs: 200 },
    });
    const subject = uniquePrefix('late-reply');
    // The create runs in Redis at once (the record is written, and indexed for the sweep); its answer comes 600 ms
    // later, after the store timeout (400 ms) and within the abort's (sent at 400 ms, its answer right behind).
    proxy.delayRepliesAfter('rl:resv:{', 600);
    await reserveUnanswered(f, subject);
    // Refunded once: by the abort (or, had its answer been late too, by the sweep's retry of it).
    const first = await drain(f, subject);
    // Past the expiry, with the sweep running every 200 ms, and once more by hand: nothing more comes back.
    await sleep(1500);
    await f.agent.reservations.sweep();
    const second = await drain(f, subject);
    expect({ first, second, total: first + second }).toMatchObject({ total: 10 });
    expect(f.agent.reservations.pendingAborts).toBe(0);
    expect(await counted(f, 'aborted')).toBe(1);
    expect(await counted(f, 'expired')).toBe(0);
  });

  /** The real store, with the create's (and maybe the abort's) answers lost as the test says. */
  function lossy(inner: RedisReservationStore, options: { createLands: 'before' | 'after-abort' }) {
    let releaseCreate: (() => void) | undefined;
    const ran: { create?: Promise<string> } = {};
    const abortFailures: ('ran' | 'not-sent')[] = [];
    const store: ReservationStore & { abortFailures: typeof abortFailures; release(): void } = {
      abortFailures,
      release: () => releaseCreate?.(),
      async create(id: string, body: ReservationBody, amountMicros: number, ttlMs: number) {
        if (options.createLands === 'before') {
          // It runs; its answer is lost.
          await inner.create(id, body, amountMicros, ttlMs);
          throw new WireTimeoutError('reservation create script', 100);
        }
        // Sent, but it reaches Redis only once the agent has aborted (a retransmission, a slow link).
        const gate = new Promise<void>((resolve) => (releaseCreate = resolve));
        ran.create = gate.then(() =>
          inner.create(id, body, amountMicros, ttlMs).then(
            () => 'written',
            (error: unknown) => (error instanceof Error ? error.message : String(error)),
          ),
        );
        throw new WireTimeoutError('reservation create script', 100);
      },
      async settle(id: string, action: SettleAction, micros: number): Promise<SettleOutcome> {
        if (action === 'abort') {
          const failure = abortFailures.shift();
          if (failure === 'not-sent') throw new WireTimeoutError('reservation settle script', 100);
          const outcome = await inner.settle(id, action, micros);
          releaseCreate?.();
          if (failure === 'ran') throw new WireTimeoutError('reservation settle script', 100);
          return outcome;
        }
        return inner.settle(id, action, micros);
      },
      index: (id, dueAtMs) => inner.index(id, dueAtMs),
      due: (nowMs, limit) => inner.due(nowMs, limit),
      unindex: (id) => inner.unindex(id),
    };
    return { store, ran };
  }

  async function lossyAgent(createLands: 'before' | 'after-abort') {
    const redis = new Redis(server.url);
    redis.on('error', () => undefined);
    const { store, ran } = lossy(new RedisReservationStore(redis, { timeoutMs: 2000 }), { createLands });
    const f = await agentFixture({
      policies,
      redis: { client: redis },
      config: { reservationSweepMs: 0 },
      deps: { reservations: store },
    });
    return {
      f,
      store,
      ran,
      async [Symbol.asyncDispose]() {
        await f[Symbol.asyncDispose]();
        redis.disconnect();
      },
    };
  }

  it('the create lands after the abort: the tombstone refuses it, writing nothing; refunded once', async () => {
    await using t = await lossyAgent('after-abort');
    const subject = uniquePrefix('late-create');
    await reserveUnanswered(t.f, subject);
    t.store.release();
    expect(await t.ran.create).toMatch(/QP_EXISTS/);
    expect(await drain(t.f, subject)).toBe(10);
    await sleep(1100);
    expect(await t.f.agent.reservations.sweep()).toBe(0);
    expect(await drain(t.f, subject)).toBe(0);
    expect(await counted(t.f, 'aborted')).toBe(1);
  });

  it('the abort ran but its answer was lost: the sweep retries it and refunds once', async () => {
    await using t = await lossyAgent('before');
    t.store.abortFailures.push('ran');
    const subject = uniquePrefix('lost-abort');
    await reserveUnanswered(t.f, subject);
    expect(t.f.agent.reservations.pendingAborts).toBe(1);
    // Aborted in Redis, not refunded yet: 5 held.
    expect(await drain(t.f, subject)).toBe(5);
    expect(await t.f.agent.reservations.sweep()).toBe(0);
    expect(t.f.agent.reservations.pendingAborts).toBe(0);
    expect(await drain(t.f, subject)).toBe(5);
    await sleep(1100);
    expect(await t.f.agent.reservations.sweep()).toBe(0);
    expect(await drain(t.f, subject)).toBe(0);
    expect(await counted(t.f, 'aborted')).toBe(1);
  });

  it('the abort never got through and the sweep expired the record first: that expiry is the one refund', async () => {
    await using t = await lossyAgent('before');
    t.store.abortFailures.push('not-sent', 'not-sent');
    const subject = uniquePrefix('expired-first');
    await reserveUnanswered(t.f, subject);
    expect(await drain(t.f, subject)).toBe(5);
    await sleep(1100);
    // The retry fails again; the record is due: the sweep expires it and refunds it whole.
    expect(await t.f.agent.reservations.sweep()).toBe(1);
    expect(t.f.agent.reservations.pendingAborts).toBe(1);
    expect(await drain(t.f, subject)).toBe(5);
    // The next retry finds it expired: nothing more.
    expect(await t.f.agent.reservations.sweep()).toBe(0);
    expect(t.f.agent.reservations.pendingAborts).toBe(0);
    expect(await drain(t.f, subject)).toBe(0);
    expect(await counted(t.f, 'aborted')).toBe(0);
    expect(await counted(t.f, 'expired')).toBe(1);
  });
});
