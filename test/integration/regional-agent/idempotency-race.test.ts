/**
 * A retry that races its first call, on a real Redis, with two agents of one region: the first call of a
 * several-group request (a token bucket and a concurrency slot: two groups) has charged its first group and
 * written its record when its second group's answer is slow; the client's retry, on the other agent, replays the
 * first group's record and decides the second afresh. If the first call is then denied, it refunds the grant the
 * replay stood on: without a check, the retry was admitted on nothing (13 admitted on a bucket of 10 in three
 * rounds, found by review). Such a retry is now a 409 that gives back what it charged, and a retry after the
 * first call's answer is decided as usual.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../core/policy/policy.js';
import type { RedisServer } from '../../harness/backend.js';
import { backend, uniquePrefix } from '../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';
import { replyDelayingProxy } from '../../helpers/reply-delaying-proxy.js';
import type { Forwarder } from '../../../regional-agent/decisions/forwarder.js';

const policies = [
  parsePolicy({ name: 'tokens', capacity: 10, refillPerSecond: 1e-4 }),
  parsePolicy({ name: 'slots', kind: 'concurrency', capacity: 1, leaseSeconds: 60 }),
];
const config = {
  leaseTokenSecret: 'idempotency-race-lease-secret',
  decisionDeadlineMs: 3000,
  storeTimeoutMs: 3000,
};

async function call(f: AgentFixture, method: 'POST' | 'DELETE', url: string, payload?: object) {
  const res = await f.app.inject({ method, url, ...(payload === undefined ? {} : { payload }) });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

type Result = { lease?: string };

describe('a retry racing its first call across two agents', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await backend().startRedis();
  });
  afterAll(async () => {
    await server[Symbol.asyncDispose]();
  });

  it('is a 409 that charges nothing, and the bucket admits exactly its 10 tokens', async () => {
    await using proxy = await replyDelayingProxy({ host: server.host, port: server.port });
    // Agent 1 reaches Redis through the proxy (a slow link, asked to); agent 2 directly. One Redis: one region.
    await using slow = await agentFixture({ policies, redis: { target: { redisUrl: proxy.url } }, config });
    await using fast = await agentFixture({ policies, redis: { target: { redisUrl: server.url } }, config });
    const subject = uniquePrefix('race');
    let retriesAdmitted = 0;
    for (let round = 0; round < 3; round++) {
      // Someone holds the only slot.
      const holder = await call(fast, 'POST', '/v1/decisions', { policy: 'slots', subject });
      expect(holder.body['allowed']).toBe(true);
      const lease = (holder.body['results'] as Result[])[0]!.lease!;
      const body = {
        checks: [
          { policy: 'tokens', subject },
          { policy: 'slots', subject },
        ],
        idempotencyKey: `order-${round}`,
      };
      // The first call: its token group is charged and recorded; its slot group is refused (held), slowly.
      proxy.delayRepliesAfter(`:slots`, 600);
      const first = call(slow, 'POST', '/v1/decisions', body);
      // Its slot group's command has reached Redis (its reply held), so its token group is charged and recorded:
      // a fixed pause here let a retry on a loaded machine overtake the first call and claim the key first.
      await proxy.matched();
      // The holder lets go, and the client's retry reaches the other agent while the first call is out.
      expect((await call(fast, 'DELETE', `/v1/leases/${lease}`)).status).toBe(200);
      const retry = await call(fast, 'POST', '/v1/decisions', body);
      const firstAnswer = await first;
      expect(firstAnswer.body['allowed'], JSON.stringify(firstAnswer.body)).toBe(false);
      expect(retry.status, JSON.stringify(retry.body)).toBe(409);
      expect(retry.body['code']).toBe('AGT_ERR_IDEMPOTENCY_CONFLICT');
      // Once the first call is answered (denied, refunded, its records gone), the same key decides afresh.
      const after = await call(fast, 'POST', '/v1/decisions', body);
      expect(after.body['allowed']).toBe(true);
      expect(after.body['replayed']).toBeUndefined();
      retriesAdmitted++;
      const held = (after.body['results'] as Result[])[1]!.lease!;
      expect((await call(fast, 'DELETE', `/v1/leases/${held}`)).status).toBe(200);
    }
    // The retry's slot went back with its 409: nothing is held.
    const free = await call(fast, 'POST', '/v1/decisions', { policy: 'slots', subject, dryRun: true });
    expect(free.body['allowed']).toBe(true);
    let drained = 0;
    for (; drained < 20; drained++) {
      const r = await call(fast, 'POST', '/v1/decisions', { policy: 'tokens', subject });
      if (r.body['allowed'] !== true) break;
    }
    // Three admitted retries took one token each; nothing else was charged or minted.
    expect(retriesAdmitted + drained).toBe(10);
  }, 30_000);

  it('a late retry, after its records expired, is decided afresh: every group’s record lives as long', async () => {
    // A bucket idle for 1 s expires, and so does a record of its group; the slot's group alone would keep its
    // record for the agent's bound (an hour). One TTL for the request: both go together.
    const late = [
      parsePolicy({ name: 'quick', capacity: 10, refillPerSecond: 10, idleTtlSeconds: 1 }),
      parsePolicy({ name: 'slots', kind: 'concurrency', capacity: 2, leaseSeconds: 60 }),
    ];
    await using agent = await agentFixture({
      policies: late,
      redis: { target: { redisUrl: server.url } },
      config,
    });
    const subject = uniquePrefix('late');
    const body = {
      checks: [
        { policy: 'quick', subject },
        { policy: 'slots', subject },
      ],
      idempotencyKey: 'order-late',
    };
    const first = await call(agent, 'POST', '/v1/decisions', body);
    expect(first.body['allowed']).toBe(true);
    const replay = await call(agent, 'POST', '/v1/decisions', body);
    expect(replay.body['replayed']).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 1500));
    // Both records gone: the retry is a new decision (before, the slot's record alone answered: a 409 for an hour).
    const retry = await call(agent, 'POST', '/v1/decisions', body);
    expect(retry.status, JSON.stringify(retry.body)).toBe(200);
    expect(retry.body['allowed']).toBe(true);
    expect(retry.body['replayed']).toBeUndefined();
    // It took the second slot: the first call's lease is still held.
    const third = await call(agent, 'POST', '/v1/decisions', { policy: 'slots', subject, dryRun: true });
    expect(third.body['allowed']).toBe(false);
  }, 30_000);

  it('a request whose strict answer came too late: its retry replays the home’s grant and decides the rest', async () => {
    // Two regions, each its own Redis: eu forwards the strict check to us, whose script charges and records at
    // once but whose reply reaches the us agent after eu stopped waiting. eu fails the request closed and
    // refunds its own check; the home's grant stands (the caller's retry is what it is for).
    const mixed = [
      parsePolicy({ name: 'pay', mode: 'strict', homeRegion: 'us', capacity: 2, refillPerSecond: 1e-4 }),
      parsePolicy({ name: 'loc', mode: 'local', capacity: 100, refillPerSecond: 1e-4 }),
    ];
    await using euRedis = await backend().startRedis();
    await using proxy = await replyDelayingProxy({ host: server.host, port: server.port });
    await using us = await agentFixture({
      policies: mixed,
      redis: { target: { redisUrl: proxy.url } },
      config: { ...config, region: 'us' },
    });
    const forwarder: Forwarder = {
      decide: async (_home, request) => {
        const answer = await us.agent.service.decideForwarded(
          {
            fromRegion: 'eu',
            checks: request.checks,
            idempotencyKey: request.idempotencyKey,
            dryRun: request.dryRun,
            budgetMs: 3000,
          },
          'forwarded',
        );
        if ('error' in answer) throw new Error(answer.error);
        return answer;
      },
    };
    await using eu = await agentFixture({
      policies: mixed,
      redis: { server: euRedis },
      config: { ...config, region: 'eu', decisionDeadlineMs: 300, storeTimeoutMs: 300 },
      deps: { forwarder },
    });
    const subject = uniquePrefix('lost');
    const body = {
      checks: [
        { policy: 'loc', subject },
        { policy: 'pay', subject },
      ],
      idempotencyKey: 'order-lost',
    };
    proxy.delayRepliesAfter(':pay', 800);
    const first = await call(eu, 'POST', '/v1/decisions', body);
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    expect(first.body['allowed']).toBe(false);
    expect((first.body['results'] as { reason?: string }[])[1]!.reason).toBe('home_unreachable');
    await new Promise((resolve) => setTimeout(resolve, 1000));
    // Before, every retry was a 409 (the strict record replayed, the refunded local check decided afresh) for as
    // long as the home's record lived: an hour.
    const retry = await call(eu, 'POST', '/v1/decisions', body);
    expect(retry.status, JSON.stringify(retry.body)).toBe(200);
    expect(retry.body['allowed']).toBe(true);
    expect(retry.body['replayed']).toBeUndefined();
    const again = await call(eu, 'POST', '/v1/decisions', body);
    expect(again.body).toMatchObject({ allowed: true, replayed: true });
    // One strict token spent at the home, one local token in eu: what bucket holds is a dry run's remaining + 1.
    const left = async (f: AgentFixture, policy: string): Promise<number> =>
      (
        (await call(f, 'POST', '/v1/decisions', { policy, subject, dryRun: true })).body['results'] as {
          remaining: number;
        }[]
      )[0]!.remaining + 1;
    expect(await left(us, 'pay')).toBe(1);
    expect(await left(eu, 'loc')).toBe(99);
  }, 30_000);
  it('a retry of a request one of whose groups failed open replays the first answer: no 409 for an hour', async () => {
    // A layered request whose sliding-log group's store call fails once (its policy fails open): the token group
    // is charged and recorded, the log group admitted by its failure mode (nothing charged, nothing recorded).
    const policiesOpen = [
      parsePolicy({ name: 'tokens', capacity: 10, refillPerSecond: 1e-4 }),
      parsePolicy({
        name: 'guesses',
        kind: 'sliding_log',
        capacity: 5,
        windowSeconds: 600,
        onStoreFailure: 'open',
      }),
    ];
    let failLog = 1;
    await using agent = await agentFixture({
      policies: policiesOpen,
      redis: { target: { redisUrl: server.url } },
      config,
      store: (inner) =>
        new Proxy(inner, {
          get(target, prop, receiver) {
            const value: unknown = Reflect.get(target, prop, receiver);
            if (typeof value !== 'function') return value;
            return (...args: unknown[]) => {
              if (prop === 'decideLog' && failLog > 0) {
                failLog--;
                return Promise.reject(new Error('the log slot is unreachable'));
              }
              return (value as (...a: unknown[]) => unknown).apply(target, args);
            };
          },
        }),
    });
    const subject = uniquePrefix('open');
    const body = {
      checks: [
        { policy: 'tokens', subject },
        { policy: 'guesses', subject },
      ],
      idempotencyKey: 'order-open',
    };
    const first = await call(agent, 'POST', '/v1/decisions', body);
    expect(first.body['allowed'], JSON.stringify(first.body)).toBe(true);
    expect((first.body['results'] as { reason?: string }[])[1]!.reason).toBe('fail_open');
    // The client lost the answer and retries, long after the first call was answered: nothing races it.
    const retry = await call(agent, 'POST', '/v1/decisions', body);
    expect(retry.status, JSON.stringify(retry.body)).toBe(200);
    expect(retry.body['allowed']).toBe(true);
    // The log group is recorded now: the next retry replays the whole request.
    const again = await call(agent, 'POST', '/v1/decisions', body);
    expect(again.body).toMatchObject({ allowed: true, replayed: true });
    // The token group was charged once.
    const tokens = await call(agent, 'POST', '/v1/decisions', { policy: 'tokens', subject, dryRun: true });
    expect((tokens.body['results'] as { remaining: number }[])[0]!.remaining).toBe(8);
  }, 30_000);
});
