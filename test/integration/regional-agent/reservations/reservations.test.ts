import { agentOnRedis } from '../../../helpers/agent-fixture.js';
import calculateSlot from 'cluster-key-slot';
import type { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import {
  createArguments,
  parseSettleReply,
  ReservationModel,
  ReservationResponse,
  reservationKey,
  settleArguments,
  SettlementResponse,
} from '../../../../core/models/reservation.js';
import { slidingLogKey } from '../../../../core/models/sliding-log.js';
import { AgentClient } from '../../../../packages/client/src/index.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import { connectRedis, whenReady } from '../../../../regional-agent/redis/connect.js';
import { checkSettle, reservationCases } from '../../../cases/reservation-cases.js';
import { LOG_CASE_EPOCH_MICROS } from '../../../cases/sliding-log-cases.js';
import { sharedRedis, uniquePrefix } from '../../../harness/fixtures.js';
import { eventually } from '../../../helpers/coordinator-fixture.js';
import { withClockArg } from '../../../helpers/lua-test-build.js';

const policies = [
  // Refill so slow that nothing comes back during a test: every token seen is a refund.
  parsePolicy({ name: 'tokens', capacity: 100, refillPerSecond: 1e-4, maxCost: 100 }),
  parsePolicy({ name: 'calls', kind: 'sliding_log', capacity: 10, windowSeconds: 3600, maxCost: 10 }),
  parsePolicy({ name: 'slots', kind: 'concurrency', capacity: 2, leaseSeconds: 60 }),
  parsePolicy({ name: 'global', capacity: 10, refillPerSecond: 1e-4, maxCost: 10 }),
];

function agentOn(redis: Redis | Cluster, sweepMs = 0, region = 'us'): AgentApp {
  return agentOnRedis(redis, policies, { sweepMs, region });
}

async function call(agent: AgentApp, method: 'POST' | 'DELETE', url: string, payload?: object) {
  const res = await agent.app.inject({ method, url, ...(payload === undefined ? {} : { payload }) });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

async function reserve(agent: AgentApp, body: object) {
  const r = await call(agent, 'POST', '/v1/reservations', body);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return ReservationResponse.parse(r.body);
}

async function settle(agent: AgentApp, id: string, amount?: number) {
  const r =
    amount === undefined
      ? await call(agent, 'DELETE', `/v1/reservations/${id}`)
      : await call(agent, 'POST', `/v1/reservations/${id}/commit`, { amount });
  return r;
}

/** Tokens a bucket holds now (a dry run), floored. */
async function tokens(agent: AgentApp, subject: string, policy = 'tokens'): Promise<number> {
  const r = await call(agent, 'POST', '/v1/decisions', { policy, subject, dryRun: true });
  const result = (r.body['results'] as { remaining: number }[])[0]!;
  return r.body['allowed'] === true ? result.remaining + 1 : result.remaining;
}

const redis = sharedRedis();
redis.defineCommand('qpResvCreateAt', { lua: withClockArg('reservation_create') });
redis.defineCommand('qpResvSettleAt', { lua: withClockArg('reservation_settle') });
type At = (n: number, ...a: string[]) => Promise<unknown>;
const createAt = (redis as unknown as { qpResvCreateAt: At }).qpResvCreateAt.bind(redis);
const settleAt = (redis as unknown as { qpResvSettleAt: At }).qpResvSettleAt.bind(redis);
let agent: AgentApp;

beforeAll(async () => {
  agent = agentOn(redis);
  await agent.ready;
});
afterAll(async () => {
  await agent.close();
});

describe('lua/reservation_create.lua and lua/reservation_settle.lua agree exactly with the model', () => {
  for (const c of reservationCases) {
    it(c.name, async () => {
      const model = new ReservationModel();
      const key = reservationKey(uniquePrefix('resv'));
      const body = { region: 'us', charges: [] };
      for (const [i, s] of c.steps.entries()) {
        const now = LOG_CASE_EPOCH_MICROS + Math.round(s.at * 1000);
        if (s.op === 'create') {
          const argv = createArguments(body, s.amount, s.ttlMs);
          if (s.refused === true) {
            const before = await redis.hgetall(key);
            await expect(createAt(1, key, ...argv, String(now)), `step ${i}`).rejects.toThrow(/QP_EXISTS/);
            expect(() => model.create(key, argv, now), `step ${i}`).toThrow(/QP_EXISTS/);
            expect(await redis.hgetall(key), `step ${i}: nothing written`).toEqual(before);
            continue;
          }
          const got = (await createAt(1, key, ...argv, String(now))) as number[];
          expect(got[0]).toBe(model.create(key, argv, now));
          continue;
        }
        const argv = settleArguments(s.op, s.amount ?? 0);
        const got = parseSettleReply(await settleAt(1, key, ...argv, String(now)));
        expect(got, `step ${i}`).toEqual(model.settle(key, argv, now));
        expect(checkSettle(s.expect, got), `step ${i}`).toEqual([]);
      }
    });
  }

  it('refuses malformed arguments and an existing record, writing nothing', async () => {
    const key = reservationKey(uniquePrefix('bad'));
    await expect(createAt(1, key, '{}', '0', '1000', '1000', '1')).rejects.toThrow(/QP_BADARG amount/);
    expect(await redis.exists(key)).toBe(0);
    await createAt(1, key, '{}', '5', '1000', '1000', '1');
    await expect(createAt(1, key, '{}', '5', '1000', '1000', '1')).rejects.toThrow(/QP_EXISTS/);
    await expect(settleAt(1, key, 'take', '0', '1000', '1')).rejects.toThrow(/QP_BADARG action/);
  });
});

describe('reservations through the agent on a real Redis', () => {
  it('reserve 30, commit 12: the bucket keeps 12 charged and gets 18 back; a repeat changes nothing', async () => {
    const subject = uniquePrefix('commit');
    const r = await reserve(agent, { policy: 'tokens', subject, amount: 30 });
    expect(r.allowed).toBe(true);
    expect(r.reservation).toMatchObject({ amount: 30, expiresInMs: 300_000 });
    expect(await tokens(agent, subject)).toBe(70);
    const id = r.reservation!.id;
    const done = await settle(agent, id, 12);
    expect(done.status).toBe(200);
    expect(SettlementResponse.parse(done.body)).toEqual({
      id,
      state: 'committed',
      reserved: 30,
      committed: 12,
      refunded: 18,
      replayed: false,
    });
    expect(await tokens(agent, subject)).toBe(88);
    expect((await settle(agent, id, 12)).body).toMatchObject({ replayed: true, refunded: 18 });
    expect(await tokens(agent, subject)).toBe(88);
    expect((await settle(agent, id, 13)).body).toMatchObject({
      status: 409,
      code: 'AGT_ERR_RESERVATION_SETTLED',
    });
    expect((await settle(agent, id)).body).toMatchObject({
      status: 409,
      code: 'AGT_ERR_RESERVATION_SETTLED',
    });
    expect(await tokens(agent, subject)).toBe(88);
  });

  it('cancel refunds everything; bad ids, other regions, amounts above the reservation are refused and change nothing', async () => {
    const subject = uniquePrefix('cancel');
    const id = (await reserve(agent, { policy: 'tokens', subject, amount: 40 })).reservation!.id;
    expect((await settle(agent, id, 41)).body).toMatchObject({
      status: 400,
      code: 'AGT_ERR_COMMIT_ABOVE_RESERVED',
    });
    expect((await settle(agent, 'nope', 1)).body).toMatchObject({
      status: 400,
      code: 'AGT_ERR_INVALID_RESERVATION',
    });
    expect((await settle(agent, `eu.${id.slice(3)}`, 1)).body).toMatchObject({
      status: 421,
      code: 'AGT_ERR_WRONG_REGION',
    });
    expect((await settle(agent, `us.${'A'.repeat(22)}`, 1)).body).toMatchObject({
      status: 404,
      code: 'AGT_ERR_UNKNOWN_RESERVATION',
    });
    expect(await tokens(agent, subject)).toBe(60);
    expect((await settle(agent, id)).body).toMatchObject({ state: 'cancelled', refunded: 40 });
    expect(await tokens(agent, subject)).toBe(100);
    expect((await settle(agent, id)).body).toMatchObject({ state: 'cancelled', replayed: true });
    expect(await tokens(agent, subject)).toBe(100);
  });

  it('refused bodies and kinds: 400 with a stable code, nothing charged', async () => {
    const subject = uniquePrefix('badbody');
    for (const body of [
      { policy: 'tokens', subject },
      { policy: 'tokens', subject, amount: 1, ttlSeconds: 3601 },
    ]) {
      expect((await call(agent, 'POST', '/v1/reservations', body)).body).toMatchObject({
        status: 400,
        code: 'AGT_ERR_INVALID_RESERVATION',
      });
    }
    expect(
      (await call(agent, 'POST', '/v1/reservations', { policy: 'slots', subject, amount: 1 })).body,
    ).toMatchObject({
      code: 'AGT_ERR_INVALID_RESERVATION',
    });
    expect(
      (await call(agent, 'POST', '/v1/reservations', { policy: 'calls', subject, amount: 1.5 })).body,
    ).toMatchObject({
      code: 'AGT_ERR_INVALID_COST',
    });
    expect(await tokens(agent, subject)).toBe(100);
  });

  it('layered with a sliding log: a commit of 3 of 8 gives back 5 tokens and the 5 newest entries', async () => {
    const subject = uniquePrefix('layer');
    const r = await reserve(agent, {
      checks: [
        { policy: 'tokens', subject },
        { policy: 'calls', subject },
      ],
      amount: 8,
    });
    expect(r.allowed).toBe(true);
    expect(await redis.zcount(slidingLogKey(1, subject, 'calls'), '(-inf', '+inf')).toBe(8);
    await settle(agent, r.reservation!.id, 3);
    expect(await redis.zcount(slidingLogKey(1, subject, 'calls'), '(-inf', '+inf')).toBe(3);
    expect(await tokens(agent, subject)).toBe(97);
    // A denied reservation holds nothing: 8 more do not fit the log (3 + 8 > 10), so no token is charged either.
    const denied = await reserve(agent, {
      checks: [
        { policy: 'tokens', subject },
        { policy: 'calls', subject },
      ],
      amount: 8,
    });
    expect(denied.allowed).toBe(false);
    expect(denied.reservation).toBeUndefined();
    expect(await tokens(agent, subject)).toBe(97);
  });

  it('500 racing reservations of 1 on 100 tokens: exactly 100 held; cancelling them all restores exactly 100', async () => {
    const subject = uniquePrefix('race');
    const all = await Promise.all(
      Array.from({ length: 500 }, () => reserve(agent, { policy: 'tokens', subject, amount: 1 })),
    );
    const held = all.filter((r) => r.reservation !== undefined);
    expect(held).toHaveLength(100);
    expect(await tokens(agent, subject)).toBe(0);
    // Cancels and commits of 0 racing on the same reservations: each is refunded exactly once.
    await Promise.all(
      held.flatMap((r) => [settle(agent, r.reservation!.id), settle(agent, r.reservation!.id, 0)]),
    );
    expect(await tokens(agent, subject)).toBe(100);
  });

  it('an uncommitted reservation is refunded whole by the sweep when it expires, once', async () => {
    const sweeping = agentOn(redis, 50);
    const second = agentOn(redis, 50);
    await Promise.all([sweeping.ready, second.ready]);
    try {
      const subject = uniquePrefix('expire');
      const r = await reserve(sweeping, { policy: 'tokens', subject, amount: 25, ttlSeconds: 1 });
      const at = Date.now();
      expect(await tokens(sweeping, subject)).toBe(75);
      // Two agents sweep the same index: the settle script lets one of them refund.
      await eventually(async () => (await tokens(sweeping, subject)) === 100, 5000, 'refund at expiry');
      expect(Date.now() - at).toBeGreaterThanOrEqual(900);
      expect((await settle(sweeping, r.reservation!.id, 5)).body).toMatchObject({
        status: 409,
        code: 'AGT_ERR_RESERVATION_SETTLED',
      });
      expect(await tokens(sweeping, subject)).toBe(100);
      const counted = async (a: AgentApp) =>
        (await a.metrics.registry.getSingleMetricAsString('quotaplane_reservations_total')).match(
          /outcome="expired"} (\d+)/,
        )?.[1] ?? '0';
      expect(Number(await counted(sweeping)) + Number(await counted(second))).toBe(1);
    } finally {
      await Promise.all([sweeping.close(), second.close()]);
    }
  });
});

describe('@quotaplane/client reservations', () => {
  it('reserve, commit, cancel through the client', async () => {
    const listening = agentOn(redis);
    await listening.ready;
    const address = await listening.app.listen({ host: '127.0.0.1', port: 0 });
    const client = new AgentClient({ baseUrl: address, timeoutMs: 2000 });
    try {
      const subject = uniquePrefix('sdk');
      const r = await client.reserve({ policy: 'tokens', subject, amount: 10 });
      expect(await client.commitReservation(r.reservation!.id, 4)).toMatchObject({ refunded: 6 });
      const again = await client.reserve({ policy: 'tokens', subject, amount: 10 });
      expect(await client.cancelReservation(again.reservation!.id)).toMatchObject({ state: 'cancelled' });
      await expect(client.commitReservation(again.reservation!.id, 1)).rejects.toMatchObject({
        code: 'AGT_ERR_RESERVATION_SETTLED',
      });
    } finally {
      await listening.close();
    }
  });
});

describe('reservations on a real 3-master Redis Cluster', () => {
  let cluster: Cluster;
  let clusterAgent: AgentApp;
  beforeAll(async () => {
    const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
    cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
    cluster.on('error', () => undefined);
    await whenReady(cluster, 10_000);
    clusterAgent = agentOn(cluster);
    await clusterAgent.ready;
  });
  afterAll(async () => {
    await clusterAgent.close();
  });

  it('a tenant and a global ceiling on different slots: commit refunds both, a denial by the ceiling holds nothing', async () => {
    const global = uniquePrefix('all');
    let tenant = uniquePrefix('tenant');
    while (calculateSlot(bucketKey(1, tenant, 'tokens')) === calculateSlot(bucketKey(1, global, 'global'))) {
      tenant = uniquePrefix('tenant');
    }
    const body = {
      checks: [
        { policy: 'tokens', subject: tenant },
        { policy: 'global', subject: global },
      ],
      amount: 6,
    };
    const r = await reserve(clusterAgent, body);
    expect(r.allowed).toBe(true);
    expect((await reserve(clusterAgent, body)).allowed).toBe(false);
    expect(await tokens(clusterAgent, tenant)).toBe(94);
    await settle(clusterAgent, r.reservation!.id, 1);
    expect(await tokens(clusterAgent, tenant)).toBe(99);
    expect(await tokens(clusterAgent, global, 'global')).toBe(9);
  });
});
