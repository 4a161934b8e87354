import { afterAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { encodeRequest, parseReply, scriptArguments, type BucketCheck } from '../../../core/wire/bucket.js';
import { transferBucket } from '../../../core/models/transfer.js';
import {
  grantArguments,
  grantBatchArguments,
  parseBatchReply,
  parseReturnReply,
  parseTakeReply,
  returnOnModel,
  takeOnModel,
  type EncodedGrant,
  type GrantOp,
} from '../../../core/models/grant.js';
import { grantRecordKey } from '../../../core/keys.js';
import { RedisGrantStore } from '../../../regional-agent/grants/grant-store.js';
import { BucketModel, MICRO } from '../../../core/models/token-bucket.js';
import { tokenBucketWithClockArg, withClockArg } from '../../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

const redis = sharedRedis();
redis.defineCommand('qpTokenBucketAt', { lua: tokenBucketWithClockArg() });
redis.defineCommand('qpGrantAt', { lua: withClockArg('grant') });
type Call = (n: number, ...a: string[]) => Promise<unknown>;
const scripts = redis as unknown as { qpTokenBucketAt: Call; qpGrantAt: Call };

afterAll(() => redis.disconnect());

const EPOCH = 1_750_000_000_000_000;

function bucketOf(key: string, capacity: number, refillPerSecond: number): Omit<BucketCheck, 'cost'> {
  return { key, capacity, refillPerSecond, ttlMs: 3_600_000 };
}

/** A return names take number `of` (in order, from 0), or a forged id (-1, or no such take). */
type Op = { op: 'charge' | 'take' | 'return'; dtMs: number; amount: number; of?: number };

/** A well-formed grant id for take number `n` (22 base64url characters), or a forged one for -1. */
const idOf = (n: number) => (n < 0 ? 'forged' : `take${n}`).padEnd(22, '_');

/** Run `ops` on the model and on Redis; returns both lists of replies. */
async function run(
  key: string,
  capacity: number,
  refill: number,
  ops: Op[],
): Promise<{ model: unknown[]; redis: unknown[] }> {
  const model = new BucketModel();
  const bucket = bucketOf(key, capacity, refill);
  const out = { model: [] as unknown[], redis: [] as unknown[] };
  let now = EPOCH;
  let takes = 0;
  for (const o of ops) {
    now += o.dtMs * 1000;
    const at = String(now);
    if (o.op === 'charge') {
      const request = encodeRequest({ checks: [{ ...bucket, cost: o.amount }] });
      out.model.push(model.evaluate(request, now));
      const { keys, argv } = scriptArguments(request);
      out.redis.push(parseReply(await scripts.qpTokenBucketAt(keys.length, ...keys, ...argv, at), 1));
    } else {
      const n = o.op === 'take' ? takes++ : (o.of ?? -1) < takes ? (o.of ?? -1) : -1;
      const grant: EncodedGrant = {
        key,
        record: grantRecordKey(key, idOf(n)),
        bucket: transferBucket(bucket),
        amount: Math.round(o.amount * MICRO),
      };
      const { keys, argv } = grantArguments(o.op, grant);
      const raw = await scripts.qpGrantAt(keys.length, ...keys, ...argv, at);
      if (o.op === 'take') {
        out.model.push(takeOnModel(model, grant, now));
        out.redis.push(parseTakeReply(raw));
      } else {
        out.model.push(returnOnModel(model, grant, now));
        out.redis.push(parseReturnReply(raw));
      }
    }
  }
  return out;
}

describe('lua/grant.lua on a real Redis agrees exactly with core/models/grant.ts', () => {
  it('takes what is there and never more; a return credits at most its grant, once', async () => {
    const key = `rl:v1:{${uniquePrefix('grant')}}:p`;
    const { model, redis: got } = await run(key, 10, 0, [
      { op: 'take', dtMs: 0, amount: 4 },
      { op: 'charge', dtMs: 0, amount: 5 },
      { op: 'take', dtMs: 0, amount: 4 },
      { op: 'charge', dtMs: 0, amount: 1 },
      { op: 'return', dtMs: 0, amount: 3, of: 0 },
      { op: 'return', dtMs: 0, amount: 9, of: 0 },
      { op: 'return', dtMs: 0, amount: 9, of: -1 },
      { op: 'return', dtMs: 0, amount: 9, of: 1 },
    ]);
    expect(got).toEqual(model);
    // 10 tokens: a grant of 4, 5 spent directly, the next grant gets the last 1, nothing to charge. 3 handed back
    // of the first grant are credited; its second return, and a forged id, credit nothing (unknown); 9 handed
    // back of the second grant are credited only the 1 it took.
    expect(got).toEqual([
      { granted: 4 * MICRO, remaining: 6 * MICRO, refillMs: 0 },
      expect.objectContaining({
        allowed: true,
        results: [expect.objectContaining({ remaining: 1 * MICRO })],
      }),
      { granted: 1 * MICRO, remaining: 0, refillMs: -1 },
      expect.objectContaining({ allowed: false }),
      { credited: 3 * MICRO, dropped: 0, tokens: 3 * MICRO, known: true },
      { credited: 0, dropped: 9 * MICRO, tokens: 0, known: false },
      { credited: 0, dropped: 9 * MICRO, tokens: 0, known: false },
      { credited: 1 * MICRO, dropped: 8 * MICRO, tokens: 4 * MICRO, known: true },
    ]);
    // Every record is spent: none is left to credit again.
    expect(await redis.exists(grantRecordKey(key, idOf(0)), grantRecordKey(key, idOf(1)))).toBe(0);
  });

  it('a take records its grant next to the bucket, in its slot, for the record TTL; an empty take none', async () => {
    const key = `rl:v1:{${uniquePrefix('grant')}}:p`;
    await run(key, 10, 0, [
      { op: 'take', dtMs: 0, amount: 10 },
      { op: 'take', dtMs: 0, amount: 1 },
    ]);
    const record = grantRecordKey(key, idOf(0));
    expect(record.startsWith(`rl:grant:{${key.slice(key.indexOf('{') + 1, key.indexOf('}'))}}:`)).toBe(true);
    expect(await redis.hgetall(record)).toEqual({ k: key, a: String(10 * MICRO) });
    const ttl = await redis.pttl(record);
    expect(ttl).toBeGreaterThan(1_000);
    expect(ttl).toBeLessThanOrEqual(2_000);
    expect(await redis.exists(grantRecordKey(key, idOf(1)))).toBe(0);
  });

  it('a return of another bucket’s grant credits nothing', async () => {
    const tag = uniquePrefix('grant');
    const a = `rl:v1:{${tag}}:a`;
    const b = `rl:v1:{${tag}}:b`;
    await run(a, 10, 0, [{ op: 'take', dtMs: 0, amount: 1 }]);
    // The same id named against bucket b (same subject, another policy): b's record key is a's, but it records a.
    await run(b, 10, 0, [{ op: 'charge', dtMs: 0, amount: 5 }]);
    const grant: EncodedGrant = {
      key: b,
      record: grantRecordKey(b, idOf(0)),
      bucket: transferBucket(bucketOf(b, 10, 0)),
      amount: MICRO,
    };
    const { keys, argv } = grantArguments('return', grant);
    const raw = await scripts.qpGrantAt(keys.length, ...keys, ...argv, String(EPOCH));
    expect(parseReturnReply(raw)).toEqual({ credited: 0, dropped: MICRO, tokens: 0, known: false });
    expect(await redis.exists(grantRecordKey(a, idOf(0)))).toBe(1);
  });

  it('a return to a bucket that expired (full) credits nothing', async () => {
    const key = `rl:v1:{${uniquePrefix('grant')}}:p`;
    const { model, redis: got } = await run(key, 10, 1, [{ op: 'return', dtMs: 0, amount: 2 }]);
    expect(got).toEqual(model);
    expect(got).toEqual([{ credited: 0, dropped: 2 * MICRO, tokens: 0, known: false }]);
    expect(await redis.exists(key)).toBe(0);
  });

  it('random sequences of charges, takes and returns: identical replies', async () => {
    const op = fc.record({
      op: fc.constantFrom('charge' as const, 'take' as const, 'return' as const),
      // At most 150 ms apart (12 ops: under 2 s): the model's clock is the script's clock argument, while Redis
      // expires grant records on its own clock, so a sequence stays within the record TTL on both.
      dtMs: fc.integer({ min: 0, max: 150 }),
      amount: fc.integer({ min: 1, max: 12_000_000 }).map((m) => m / MICRO),
      of: fc.integer({ min: -1, max: 4 }),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 50 }),
        fc.constantFrom(0, 0.5, 3),
        fc.array(op, { minLength: 1, maxLength: 12 }),
        async (capacity, refill, ops) => {
          const key = `rl:v1:{${uniquePrefix('grant-p')}}:p`;
          const { model, redis: got } = await run(key, capacity, refill, ops);
          expect(got).toEqual(model);
        },
      ),
      { numRuns: 60 },
    );
  });

  it('a batch of takes in one call never takes more than the bucket holds: 12 takes of 3 from 10 give 3+3+3+1', async () => {
    const key = `rl:v1:{${uniquePrefix('grant-b')}}:p`;
    const ops: GrantOp[] = Array.from({ length: 12 }, (_, i) => ({
      mode: 'take',
      grant: {
        key,
        record: grantRecordKey(key, idOf(i)),
        bucket: transferBucket(bucketOf(key, 10, 0)),
        amount: 3 * MICRO,
      },
    }));
    const { keys, argv } = grantBatchArguments(ops);
    const got = parseBatchReply(
      await scripts.qpGrantAt(keys.length, ...keys, ...argv, String(EPOCH)),
      ops.map((o) => o.mode),
    );
    expect(got.map((r) => (r as { granted: number }).granted / MICRO)).toEqual([
      3, 3, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    // Only the four takes that gave tokens are recorded, each with what it took.
    for (let i = 0; i < 12; i++) {
      const record = await redis.hget(grantRecordKey(key, idOf(i)), 'a');
      expect(record).toBe(i < 3 ? String(3 * MICRO) : i === 3 ? String(MICRO) : null);
    }
  });

  it('random batches of takes and returns over a few buckets: one call answers as the model run in order', async () => {
    const op = fc.record({
      mode: fc.constantFrom('take' as const, 'return' as const),
      bucket: fc.integer({ min: 0, max: 2 }),
      amount: fc.integer({ min: 1, max: 6_000_000 }),
      // A return names the grant of the op at this index (a take of this batch or of an earlier one), or none.
      of: fc.integer({ min: -1, max: 20 }),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.array(op, { minLength: 1, maxLength: 20 }), { minLength: 1, maxLength: 3 }),
        fc.integer({ min: 1, max: 20 }),
        async (batches, capacity) => {
          const tag = uniquePrefix('grant-bp');
          const model = new BucketModel();
          let now = EPOCH;
          for (const [b, batch] of batches.entries()) {
            now += 50_000;
            const ops: GrantOp[] = batch.map((o, i) => {
              const key = `rl:v1:{${tag}}:p${o.bucket}`;
              const id =
                o.mode === 'take' ? `${b}.${i}` : o.of < 0 ? 'forged' : `${Math.max(0, b - 1)}.${o.of}`;
              return {
                mode: o.mode,
                grant: {
                  key,
                  record: grantRecordKey(key, id.padEnd(22, '_')),
                  bucket: transferBucket(bucketOf(key, capacity, 1)),
                  amount: o.amount,
                },
              };
            });
            const { keys, argv } = grantBatchArguments(ops);
            const got = parseBatchReply(
              await scripts.qpGrantAt(keys.length, ...keys, ...argv, String(now)),
              ops.map((o) => o.mode),
            );
            const want = ops.map((o) =>
              o.mode === 'take' ? takeOnModel(model, o.grant, now) : returnOnModel(model, o.grant, now),
            );
            expect(got).toEqual(want);
          }
        },
      ),
      { numRuns: 40 },
    );
  });

  it('the grant store sends the takes and returns of one turn in one script call, each answered on its own', async () => {
    const store = new RedisGrantStore(redis);
    const key = `rl:v1:{${uniquePrefix('grant-store')}}:p`;
    const grant = (i: number, amount: number): EncodedGrant => ({
      key,
      record: grantRecordKey(key, idOf(i)),
      bucket: transferBucket(bucketOf(key, 10, 0)),
      amount: amount * MICRO,
    });
    const takes = await Promise.all(Array.from({ length: 5 }, (_, i) => store.take(grant(i, 3))));
    expect(store.calls).toBe(1);
    expect(takes.map((t) => t.granted / MICRO)).toEqual([3, 3, 3, 1, 0]);
    // Two returns of the same grant in one turn: the first is credited, the second finds no record.
    const back = await Promise.all([
      store.giveBack(grant(0, 3)),
      store.giveBack(grant(0, 3)),
      store.take(grant(9, 2)),
    ]);
    expect(store.calls).toBe(2);
    expect(back).toEqual([
      { credited: 3 * MICRO, dropped: 0, tokens: 3 * MICRO, known: true },
      { credited: 0, dropped: 3 * MICRO, tokens: 0, known: false },
      { granted: 2 * MICRO, remaining: 1 * MICRO, refillMs: -1 },
    ]);
  });

  it('refuses bad arguments before it reads or writes anything', async () => {
    const key = `rl:v1:{${uniquePrefix('grant-bad')}}:p`;
    const record = grantRecordKey(key, idOf(0));
    const good = ['1', '1000000', '10000000', '1', '60000', '0', '0', '0', '2000'];
    const bad: [number, string][] = [
      [0, '3'],
      [1, '0'],
      [1, '1.5'],
      [2, '-1'],
      [3, 'nan'],
      [4, '0'],
      [5, '-1'],
      [8, '0'],
    ];
    for (const [at, value] of bad) {
      const argv = [...good];
      argv[at] = value;
      await expect(scripts.qpGrantAt(2, key, record, ...argv, String(EPOCH))).rejects.toThrow(/QP_BADARG/);
    }
    await expect(scripts.qpGrantAt(2, key, record, ...good.slice(1), String(EPOCH))).rejects.toThrow(
      /QP_BADARG/,
    );
    await expect(scripts.qpGrantAt(1, key, ...good, String(EPOCH))).rejects.toThrow(/QP_BADARG/);
    // A batch: 9 arguments and 2 keys per operation, and a bad second operation refuses the whole call, the
    // first operation (a good take) included.
    const other = grantRecordKey(key, idOf(1));
    await expect(scripts.qpGrantAt(3, key, record, key, ...good, ...good, String(EPOCH))).rejects.toThrow(
      /QP_BADARG/,
    );
    const badSecond = [...good];
    badSecond[1] = '0';
    await expect(
      scripts.qpGrantAt(4, key, record, key, other, ...good, ...badSecond, String(EPOCH)),
    ).rejects.toThrow(/QP_BADARG/);
    expect(await redis.exists(key, record, other)).toBe(0);
  });
});
