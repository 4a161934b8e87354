import { afterAll, describe, expect, it } from 'vitest';
import {
  logArguments,
  logRefundArguments,
  parseLogRefundReply,
  parseLogReply,
  SlidingLogModel,
  type LogRequest,
} from '../../../core/models/sliding-log.js';
import { RedisDecisionStore } from '../../../regional-agent/redis/decision-store.js';
import { RedisSlidingLogStore } from '../../../regional-agent/redis/sliding-log-store.js';
import {
  checkLogExpectations,
  logKey,
  prepareLogCase,
  slidingLogCases,
} from '../../cases/sliding-log-cases.js';
import { describeClaimAgreement } from '../../helpers/claim-agreement.js';
import { withClockArg } from '../../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

const redis = sharedRedis();
redis.defineCommand('qpSlidingLogAt', { lua: withClockArg('sliding_log') });
const at = (numKeys: number, ...args: string[]) =>
  (redis as unknown as { qpSlidingLogAt(n: number, ...a: string[]): Promise<unknown> }).qpSlidingLogAt(
    numKeys,
    ...args,
  );
const store = new RedisSlidingLogStore(redis, { timeoutMs: 5000 });

afterAll(() => redis.disconnect());

/** Scores of a log's members, as numbers, in order. */
async function scores(key: string): Promise<number[]> {
  const flat = await redis.zrange(key, '0', '-1', 'WITHSCORES');
  return flat.filter((_, i) => i % 2 === 1).map(Number);
}

describe('lua/sliding_log.lua on a real Redis agrees exactly with the model', () => {
  for (const c of slidingLogCases) {
    it(c.name, async () => {
      const model = new SlidingLogModel();
      const prefix = uniquePrefix('log');
      const problems: string[] = [];
      let i = 0;
      for (const { step, request, nowMicros } of prepareLogCase(prefix, c)) {
        const { keys, argv } = logArguments(request);
        const fromRedis = parseLogReply(
          await at(keys.length, ...keys, ...argv, String(nowMicros)),
          request.checks.length,
        );
        const fromModel = model.evaluate(request, nowMicros);
        expect(fromRedis, `call ${i} (at ${step.at} ms)`).toEqual(fromModel);
        // Redis expires keys on its own clock, the model on virtual time; a TTL never shorter than the window
        // means an expired key held only entries outside it, so what counts agrees either way.
        const held: number[] = [];
        for (const k of step.checks) {
          const key = logKey(prefix, k.log);
          const modelEntries = model.entries(key, nowMicros);
          const inWindow = (await scores(key)).filter((s) => s > nowMicros - k.windowMs * 1000);
          expect(inWindow, `entries of ${k.log} after call ${i}`).toEqual(
            modelEntries.filter((s) => s > nowMicros - k.windowMs * 1000),
          );
          held.push(modelEntries.length);
        }
        for (const p of checkLogExpectations(step, fromRedis, held)) problems.push(`call ${i}: ${p}`);
        i++;
      }
      expect(problems).toEqual([]);
    });
  }
});

describe('lua/sliding_log_refund.lua', () => {
  it('takes back exactly the entries a call wrote, and its idempotency record, as the model does', async () => {
    const prefix = uniquePrefix('logrefund');
    const key = logKey(prefix, 'a');
    const record = `rl:idem:{${prefix}}:r:log`;
    const request: LogRequest = {
      checks: [{ key, limit: 10, windowMs: 60_000, cost: 3, ttlMs: 60_000 }],
      idempotency: { key: record, ttlMs: 60_000 },
    };
    const model = new SlidingLogModel();
    const now = 1_750_000_000_000_000;
    const first = await store.decide({ checks: [{ ...request.checks[0]!, cost: 2 }] });
    const second = await store.decide(request);
    expect(first.allowed && second.allowed).toBe(true);
    expect(await redis.zcard(key)).toBe(5);
    const refund = {
      keys: [key],
      entries: [{ stamp: second.results[0]!.stamp, seq: second.results[0]!.seq, cost: 3 }],
      recordKey: record,
    };
    const { keys, argv } = logRefundArguments(refund);
    const raw = await redis.eval(
      (await import('../../../regional-agent/redis/scripts.js')).luaSource('sliding_log_refund'),
      keys.length,
      ...keys,
      ...argv,
    );
    expect(parseLogRefundReply(raw, 1)).toEqual({ removed: [3], recordDeleted: true });
    expect(await redis.zcard(key)).toBe(2);
    expect(await redis.exists(record)).toBe(0);
    // The model gives the same answer for the same call sequence at its own instant.
    model.evaluate({ checks: [{ ...request.checks[0]!, cost: 2 }] }, now);
    const m = model.evaluate(request, now);
    const mr = model.refund(
      {
        keys: [key],
        entries: [{ stamp: m.results[0]!.stamp, seq: m.results[0]!.seq, cost: 3 }],
        recordKey: record,
      },
      now,
    );
    expect(mr).toEqual({ removed: [3], recordDeleted: true });
    expect(model.entries(key, now)).toHaveLength(2);
  });

  it('refuses malformed arguments before writing anything', async () => {
    const prefix = uniquePrefix('logbad');
    const key = logKey(prefix, 'a');
    await expect(
      (redis as unknown as { qpSlidingLog(n: number, ...a: string[]): Promise<unknown> }).qpSlidingLog(
        1,
        key,
        '1',
        '0',
        '0',
        '0',
        '5',
        '1000000',
        '1.5',
        '1000',
      ),
    ).rejects.toThrow(/QP_BADARG cost of log 1 must be an integer in 1\.\.100000/);
    expect(await redis.exists(key)).toBe(0);
  });
});

describe('sliding logs on Redis time', () => {
  it('500 racing callers on a limit of 100 admit exactly 100, and the log holds exactly 100 entries', async () => {
    const key = logKey(uniquePrefix('race'), 'login');
    const check = { key, limit: 100, windowMs: 600_000, cost: 1, ttlMs: 600_000 };
    const replies = await Promise.all(Array.from({ length: 500 }, () => store.decide({ checks: [check] })));
    expect(replies.filter((r) => r.allowed)).toHaveLength(100);
    expect(await redis.zcard(key)).toBe(100);
    const ttl = await redis.pttl(key);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(600_000);
  });

  it('memory per subject is bounded by the limit: MEMORY USAGE per entry, measured', async () => {
    const measure = async (limit: number): Promise<{ bytes: number; perEntry: number }> => {
      const key = logKey(uniquePrefix('mem'), 'login');
      const check = { key, limit, windowMs: 600_000, cost: 1, ttlMs: 600_000 };
      for (let i = 0; i < limit + 20; i++) await store.decide({ checks: [check] });
      expect(await redis.zcard(key)).toBe(limit);
      const bytes = Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'));
      return { bytes, perEntry: Math.round(bytes / limit) };
    };
    const small = await measure(5);
    const large = await measure(1000);
    console.log(
      `sliding-log MEMORY USAGE: limit 5 -> ${small.bytes} B (${small.perEntry} B/entry); limit 1000 -> ${large.bytes} B (${large.perEntry} B/entry)`,
    );
    // Measured here: 296 B for a log of 5 (listpack), 118 B an entry for 1000 (skiplist); docs/sliding-log.md.
    expect(small.bytes).toBeLessThan(400);
    expect(large.perEntry).toBeGreaterThan(40);
    expect(large.perEntry).toBeLessThan(160);
  });
});

// A several-group request's claim of a log call's record key (regional-agent/decisions/idempotency-claim.ts).
const claims = new RedisDecisionStore(redis, { timeoutMs: 5000 });
describeClaimAgreement('sliding-log', () => {
  const prefix = uniquePrefix('claim');
  const { request, nowMicros } = prepareLogCase(prefix, {
    name: 'one check',
    steps: [{ at: 0, checks: [{ log: 'a', limit: 5, windowMs: 10_000 }], idempotencyKey: 'k' }],
  })[0]!;
  return {
    request,
    key: request.idempotency!.key,
    nowMicros,
    model: new SlidingLogModel(),
    claims,
    script: async (r: LogRequest, now: number) => {
      const { keys, argv } = logArguments(r);
      return parseLogReply(await at(keys.length, ...keys, ...argv, String(now)), r.checks.length);
    },
    untouched: async () => (await scores(logKey(prefix, 'a'))).length === 0,
  };
});
