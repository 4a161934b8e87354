import { afterAll, describe, expect, it } from 'vitest';
import {
  entryMember,
  logArguments,
  logRefundArguments,
  markMember,
  parseLogRefundReply,
  parseLogReply,
  SlidingLogModel,
  type LogRequest,
} from '../../../core/models/sliding-log.js';
import { luaSource } from '../../../regional-agent/redis/scripts.js';
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

/** Scores of a log's entries (every member but the high-water mark), as numbers, in order. */
async function scores(key: string): Promise<number[]> {
  const flat = await redis.zrangebyscore(key, '(-inf', '+inf', 'WITHSCORES');
  return flat.filter((_, i) => i % 2 === 1).map(Number);
}

/** Members of score -inf: the log's high-water mark (one, once the log has admitted). */
async function marks(key: string): Promise<string[]> {
  return redis.zrangebyscore(key, '-inf', '-inf');
}

const refundScript = luaSource('sliding_log_refund');
async function refundOnRedis(key: string, stamp: number, seq: number, cost: number) {
  const { keys, argv } = logRefundArguments({ keys: [key], entries: [{ stamp, seq, cost }] });
  return parseLogRefundReply(await redis.eval(refundScript, keys.length, ...keys, ...argv), 1).removed[0];
}

describe('lua/sliding_log.lua on a real Redis agrees exactly with the model', () => {
  for (const c of slidingLogCases) {
    it(c.name, async () => {
      const model = new SlidingLogModel();
      const prefix = uniquePrefix('log');
      const problems: string[] = [];
      const admitted = new Set<string>();
      let i = 0;
      for (const { step, request, nowMicros } of prepareLogCase(prefix, c)) {
        const { keys, argv } = logArguments(request);
        const fromRedis = parseLogReply(
          await at(keys.length, ...keys, ...argv, String(nowMicros)),
          request.checks.length,
        );
        const fromModel = model.evaluate(request, nowMicros);
        expect(fromRedis, `call ${i} (at ${step.at} ms)`).toEqual(fromModel);
        fromRedis.results.forEach((r, k) => {
          if (r.stamp > 0) admitted.add(request.checks[k]!.key);
        });
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
          // The mark as the model keeps it; once the model's key expired (virtual time) Redis may still hold it.
          const mark = model.mark(key, nowMicros);
          if (mark !== undefined)
            expect(await marks(key), `mark of ${k.log} after call ${i}`).toEqual([mark]);
          else if (!admitted.has(key))
            expect(await marks(key), `mark of ${k.log} after call ${i}`).toEqual([]);
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
    expect(await scores(key)).toHaveLength(5);
    expect(await marks(key)).toEqual([markMember(second.results[0]!.stamp, second.results[0]!.seq + 2)]);
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
    expect(await scores(key)).toHaveLength(2);
    // The mark stays: the names taken back are not issued again.
    expect(await marks(key)).toEqual([markMember(second.results[0]!.stamp, second.results[0]!.seq + 2)]);
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
    expect(model.mark(key, now)).toBe(markMember(now, 4));
  });

  it('a log emptied by refunds keeps its mark until its TTL; no refund can name the mark', async () => {
    const key = logKey(uniquePrefix('logempty'), 'a');
    const check = { key, limit: 10, windowMs: 60_000, cost: 2, ttlMs: 60_000 };
    const now = 1_750_000_000_000_000;
    const { keys, argv } = logArguments({ checks: [check] });
    const a = parseLogReply(await at(keys.length, ...keys, ...argv, String(now)), 1).results[0]!;
    expect(await refundOnRedis(key, a.stamp, a.seq, 2)).toBe(2);
    expect(await scores(key)).toEqual([]);
    expect(await marks(key)).toEqual([markMember(now, 1)]);
    const ttl = await redis.pttl(key);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
    // The refund's names are "<stamp>:<9 digits>", a mark is "~<stamp>:<seq>": even its own numbers miss it.
    expect(await refundOnRedis(key, now, 1, 1)).toBe(0);
    expect(await marks(key)).toEqual([markMember(now, 1)]);
    // The next acquire, on the same instant, continues after the mark.
    const b = parseLogReply(await at(keys.length, ...keys, ...argv, String(now)), 1).results[0]!;
    expect(b).toMatchObject({ stamp: now, seq: 2 });
    expect(await marks(key)).toEqual([markMember(now, 3)]);
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

describe('lua/sliding_log.lua: the high-water mark (score -inf, the last entry name issued)', () => {
  const now = 1_750_000_000_000_000;
  const decideAt = async (request: LogRequest, micros: number) => {
    const { keys, argv } = logArguments(request);
    return parseLogReply(await at(keys.length, ...keys, ...argv, String(micros)), request.checks.length);
  };

  it('a log written before the mark: decided on its entries as before, then marked', async () => {
    const key = logKey(uniquePrefix('legacy'), 'a');
    const check = { key, limit: 10, windowMs: 60_000, cost: 2, ttlMs: 60_000 };
    // Entries an earlier version wrote, the newest 5 s ahead of Redis time (a clock step back).
    await redis.zadd(
      key,
      now - 1000,
      entryMember(now - 1000, 0),
      now + 5_000_000,
      entryMember(now + 5_000_000, 4),
    );
    const r = await decideAt({ checks: [check] }, now);
    expect(r.results[0]).toMatchObject({ allowed: true, remaining: 6, stamp: now + 5_000_000, seq: 5 });
    expect(await marks(key)).toEqual([markMember(now + 5_000_000, 6)]);
    expect(await scores(key)).toHaveLength(4);
  });

  it('dry runs and denials leave the mark as it was; neither creates one', async () => {
    const key = logKey(uniquePrefix('drydeny'), 'a');
    const check = { key, limit: 2, windowMs: 60_000, cost: 1, ttlMs: 60_000 };
    expect((await decideAt({ checks: [check], dryRun: true }, now)).allowed).toBe(true);
    expect((await decideAt({ checks: [{ ...check, cost: 3 }] }, now)).allowed).toBe(false);
    expect(await redis.exists(key)).toBe(0);
    await decideAt({ checks: [check] }, now);
    await decideAt({ checks: [check] }, now + 1);
    expect(await marks(key)).toEqual([markMember(now + 1, 0)]);
    expect((await decideAt({ checks: [check], dryRun: true }, now + 2)).allowed).toBe(false);
    expect((await decideAt({ checks: [check] }, now + 3)).allowed).toBe(false);
    expect(await marks(key)).toEqual([markMember(now + 1, 0)]);
  });

  it('the window trim keeps the mark, counts never include it, and the next stamp is not below it', async () => {
    const key = logKey(uniquePrefix('trim'), 'a');
    const check = { key, limit: 1, windowMs: 1000, cost: 1, ttlMs: 60_000 };
    await decideAt({ checks: [check] }, now);
    // One window later the entry has left: trimmed, admitted, the mark moves to the new entry.
    const r = await decideAt({ checks: [check] }, now + 1_000_000);
    expect(r.results[0]).toMatchObject({ allowed: true, remaining: 0, stamp: now + 1_000_000, seq: 0 });
    expect(await scores(key)).toEqual([now + 1_000_000]);
    // A denial much later trims every entry; the mark stays, and a clock far behind it stamps at it.
    expect((await decideAt({ checks: [{ ...check, cost: 2 }] }, now + 10_000_000)).allowed).toBe(false);
    expect(await scores(key)).toEqual([]);
    expect(await marks(key)).toEqual([markMember(now + 1_000_000, 0)]);
    const back = await decideAt({ checks: [check] }, now - 60_000_000);
    expect(back.results[0]).toMatchObject({ allowed: true, remaining: 0, stamp: now + 1_000_000, seq: 1 });
  });

  it('a cost of 100000: the mark names the last of them; their release leaves the names unused', async () => {
    const key = logKey(uniquePrefix('bulk'), 'a');
    const check = { key, limit: 100_000, windowMs: 60_000, cost: 100_000, ttlMs: 60_000 };
    const r = await decideAt({ checks: [check] }, now);
    expect(r.results[0]).toMatchObject({ allowed: true, remaining: 0, stamp: now, seq: 0 });
    expect(await marks(key)).toEqual([markMember(now, 99_999)]);
    expect(await redis.zcard(key)).toBe(100_001);
    expect(await refundOnRedis(key, now, 0, 100_000)).toBe(100_000);
    expect(await redis.zcard(key)).toBe(1);
    const again = await decideAt({ checks: [{ ...check, cost: 1 }] }, now);
    expect(again.results[0]).toMatchObject({ allowed: true, stamp: now, seq: 100_000 });
    expect(await scores(key)).toEqual([now]);
    expect(await redis.zrangebyscore(key, '(-inf', '+inf')).toEqual([entryMember(now, 100_000)]);
    expect(await refundOnRedis(key, now, 0, 100_000)).toBe(0);
  });
});

describe('sliding logs on Redis time', () => {
  it('500 racing callers on a limit of 100 admit exactly 100, and the log holds exactly 100 entries', async () => {
    const key = logKey(uniquePrefix('race'), 'login');
    const check = { key, limit: 100, windowMs: 600_000, cost: 1, ttlMs: 600_000 };
    const replies = await Promise.all(Array.from({ length: 500 }, () => store.decide({ checks: [check] })));
    expect(replies.filter((r) => r.allowed)).toHaveLength(100);
    // 100 entries and the high-water mark, which names the last of them.
    expect(await redis.zcard(key)).toBe(101);
    const last = (await redis.zrevrangebyscore(key, '+inf', '(-inf', 'LIMIT', 0, 1))[0]!;
    const [stamp = '', seq = ''] = last.split(':');
    expect(await marks(key)).toEqual([markMember(Number(stamp), Number(seq))]);
    const ttl = await redis.pttl(key);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(600_000);
  });

  it('memory per subject is bounded by the limit: MEMORY USAGE per entry, measured', async () => {
    const measure = async (limit: number): Promise<{ bytes: number; perEntry: number }> => {
      const key = logKey(uniquePrefix('mem'), 'login');
      const check = { key, limit, windowMs: 600_000, cost: 1, ttlMs: 600_000 };
      for (let i = 0; i < limit + 20; i++) await store.decide({ checks: [check] });
      expect(await redis.zcard(key)).toBe(limit + 1);
      const bytes = Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'));
      return { bytes, perEntry: Math.round(bytes / limit) };
    };
    const small = await measure(5);
    const large = await measure(1000);
    console.log(
      `sliding-log MEMORY USAGE: limit 5 -> ${small.bytes} B (${small.perEntry} B/entry); limit 1000 -> ${large.bytes} B (${large.perEntry} B/entry)`,
    );
    // Measured here: 296 B for a log of 5 (listpack), 119 B an entry for 1000 (skiplist, the mark included); docs/sliding-log.md.
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
    untouched: async () => (await redis.exists(logKey(prefix, 'a'))) === 0,
  };
});
