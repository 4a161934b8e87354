import { agentOnRedis } from '../../../helpers/agent-fixture.js';
import calculateSlot from 'cluster-key-slot';
import type { Cluster, Redis } from 'ioredis';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import {
  DailyBudgetModel,
  dailyKey,
  dayArguments,
  dayRefundArguments,
  DayWindowError,
  parseDayRefundReply,
  parseDayReply,
  type DayRequest,
} from '../../../../core/models/daily-budget.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import { connectRedis, whenReady } from '../../../../regional-agent/redis/connect.js';
import { RedisDecisionStore } from '../../../../regional-agent/redis/decision-store.js';
import { luaSource } from '../../../../regional-agent/redis/scripts.js';
import {
  checkDayExpectations,
  dailyBudgetCases,
  dayCaseKey,
  DAY0,
  prepareDayCase,
} from '../../../cases/daily-budget-cases.js';
import { sharedRedis, uniquePrefix } from '../../../harness/fixtures.js';
import { describeClaimAgreement } from '../../../helpers/claim-agreement.js';
import { withClockArg } from '../../../helpers/lua-test-build.js';

const redis = sharedRedis();
redis.defineCommand('qpDailyAt', { lua: withClockArg('daily_budget') });
const at = (n: number, ...args: string[]) =>
  (redis as unknown as { qpDailyAt(n: number, ...a: string[]): Promise<unknown> }).qpDailyAt(n, ...args);
afterAll(() => redis.disconnect());

describe('lua/daily_budget.lua on a real Redis agrees exactly with the model', () => {
  for (const c of dailyBudgetCases) {
    it(c.name, async () => {
      const model = new DailyBudgetModel();
      const prefix = uniquePrefix('day');
      const problems: string[] = [];
      let i = 0;
      for (const { step, request, nowMicros } of prepareDayCase(prefix, c)) {
        const { keys, argv } = dayArguments(request);
        const raw = await at(keys.length, ...keys, ...argv, String(nowMicros));
        let fromRedis;
        try {
          fromRedis = parseDayReply(raw, request.checks.length);
        } catch (error) {
          if (!(error instanceof DayWindowError)) throw error;
          fromRedis = 'no_day' as const;
        }
        let fromModel;
        try {
          fromModel = model.evaluate(request, nowMicros);
        } catch (error) {
          if (!(error instanceof DayWindowError)) throw error;
          fromModel = 'no_day' as const;
        }
        expect(fromRedis, `call ${i} (at ${step.at} ms)`).toEqual(fromModel);
        for (const p of checkDayExpectations(step, fromRedis)) problems.push(`call ${i}: ${p}`);
        i++;
      }
      expect(problems).toEqual([]);
    });
  }

  it('the refund gives back to the day it names only, never more than is used, and deletes the record', async () => {
    const prefix = uniquePrefix('dayrefund');
    const key = dayCaseKey(prefix, 'a');
    const record = `rl:idem:{${prefix}}:r:day`;
    const bounds: [number, number, number, number] = [
      DAY0 - 86_400e6,
      DAY0,
      DAY0 + 86_400e6,
      DAY0 + 172_800e6,
    ];
    const request = {
      checks: [{ key, limit: 10_000_000, cost: 3_000_000, bounds }],
      idempotency: { key: record, ttlMs: 60_000 },
    };
    const { keys, argv } = dayArguments(request);
    const reply = parseDayReply(await at(keys.length, ...keys, ...argv, String(DAY0 + 5)), 1);
    expect(reply.results[0]!.start).toBe(DAY0);
    const refund = (start: number, cost: number, withRecord: boolean) => {
      const r = dayRefundArguments({
        keys: [key],
        entries: [{ start, cost }],
        recordKey: withRecord ? record : undefined,
      });
      return redis.eval(luaSource('daily_budget_refund'), r.keys.length, ...r.keys, ...r.argv);
    };
    expect(parseDayRefundReply(await refund(DAY0 - 86_400e6, 1_000_000, false), 1)).toEqual({
      refunded: [0],
      recordDeleted: false,
    });
    expect(parseDayRefundReply(await refund(DAY0, 5_000_000, true), 1)).toEqual({
      refunded: [3_000_000],
      recordDeleted: true,
    });
    expect(await redis.hget(key, 'used')).toBe('0');
    expect(await redis.exists(record)).toBe(0);
  });

  it('refuses malformed arguments before reading anything', async () => {
    const key = dayCaseKey(uniquePrefix('daybad'), 'a');
    await expect(at(1, key, '1', '0', '0', '0', '10', '1', '3', '2', '4', '5', '1')).rejects.toThrow(
      /QP_BADARG bounds of counter 1/,
    );
    expect(await redis.exists(key)).toBe(0);
  });
});

const policies = [
  parsePolicy({ name: 'daily', kind: 'daily', capacity: 100, timeZone: 'Europe/Paris', maxCost: 100 }),
  parsePolicy({ name: 'rate', capacity: 4, refillPerSecond: 1e-4, maxCost: 4 }),
];

async function agentOn(redis: Redis | Cluster): Promise<AgentApp> {
  const agent = agentOnRedis(redis, policies);
  await agent.ready;
  return agent;
}

async function decide(agent: AgentApp, body: object) {
  const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
  expect(res.statusCode, res.body).toBe(200);
  return DecisionResponse.parse(res.json());
}

describe('daily budgets through the agent', () => {
  it('500 racing callers on a day of 100 (Europe/Paris, Redis time): exactly 100; the counter expires after the day', async () => {
    const agent = await agentOn(redis);
    try {
      const subject = uniquePrefix('race');
      const all = await Promise.all(
        Array.from({ length: 500 }, () => decide(agent, { policy: 'daily', subject })),
      );
      expect(all.filter((d) => d.allowed)).toHaveLength(100);
      const key = dailyKey(1, subject, 'daily');
      expect(await redis.hget(key, 'used')).toBe('100000000');
      const ttl = await redis.pttl(key);
      expect(ttl).toBeGreaterThan(60_000);
      expect(ttl).toBeLessThanOrEqual(25 * 3_600_000 + 60_000);
    } finally {
      await agent.app.close();
    }
  });

  it('on the 3-master cluster, a rate on another slot that denies takes the day back', async () => {
    const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
    const cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
    cluster.on('error', () => undefined);
    await whenReady(cluster, 10_000);
    const agent = await agentOn(cluster);
    try {
      const tenant = uniquePrefix('tenant');
      let caller = uniquePrefix('caller');
      while (calculateSlot(dailyKey(1, tenant, 'daily')) === calculateSlot(bucketKey(1, caller, 'rate'))) {
        caller = uniquePrefix('caller');
      }
      const body = {
        checks: [
          { policy: 'daily', subject: tenant, cost: 3 },
          { policy: 'rate', subject: caller, cost: 3 },
        ],
      };
      expect((await decide(agent, body)).allowed).toBe(true);
      const denied = await decide(agent, body);
      expect(denied.allowed).toBe(false);
      expect(await cluster.hget(dailyKey(1, tenant, 'daily'), 'used')).toBe('3000000');
    } finally {
      await agent.app.close();
      cluster.disconnect();
    }
  });
});

// A several-group request's claim of a daily call's record key (regional-agent/decisions/idempotency-claim.ts).
const claims = new RedisDecisionStore(redis, { timeoutMs: 5000 });
describeClaimAgreement('daily', () => {
  const prefix = uniquePrefix('claim');
  const { request, nowMicros } = prepareDayCase(prefix, {
    name: 'one check',
    steps: [{ at: 0, checks: [{ counter: 'a', limit: 10_000_000, cost: 1_000_000 }], idempotencyKey: 'k' }],
  })[0]!;
  return {
    request,
    key: request.idempotency!.key,
    nowMicros,
    model: new DailyBudgetModel(),
    claims,
    script: async (r: DayRequest, now: number) => {
      const { keys, argv } = dayArguments(r);
      return parseDayReply(await at(keys.length, ...keys, ...argv, String(now)), r.checks.length);
    },
    untouched: async () => (await redis.exists(dayCaseKey(prefix, 'a'))) === 0,
  };
});
