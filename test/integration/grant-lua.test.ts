import { afterAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { encodeRequest, parseReply, scriptArguments, type BucketCheck } from '../../core/bucket-wire.js';
import { transferBucket } from '../../core/borrowing/transfer.js';
import {
  grantArguments,
  parseReturnReply,
  parseTakeReply,
  returnOnModel,
  takeOnModel,
  type EncodedGrant,
} from '../../core/grants.js';
import { BucketModel, MICRO } from '../../core/token-bucket.js';
import { tokenBucketWithClockArg, withClockArg } from '../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../harness/fixtures.js';

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

type Op = { op: 'charge' | 'take' | 'return'; dtMs: number; amount: number };

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
  for (const o of ops) {
    now += o.dtMs * 1000;
    const at = String(now);
    if (o.op === 'charge') {
      const request = encodeRequest({ checks: [{ ...bucket, cost: o.amount }] });
      out.model.push(model.evaluate(request, now));
      const { keys, argv } = scriptArguments(request);
      out.redis.push(parseReply(await scripts.qpTokenBucketAt(keys.length, ...keys, ...argv, at), 1));
    } else {
      const grant: EncodedGrant = {
        key,
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

describe('lua/grant.lua on a real Redis agrees exactly with core/grants.ts', () => {
  it('takes what is there and never more; a return fills up to the capacity and drops the rest', async () => {
    const key = `rl:v1:{${uniquePrefix('grant')}}:p`;
    const { model, redis: got } = await run(key, 10, 0, [
      { op: 'take', dtMs: 0, amount: 4 },
      { op: 'charge', dtMs: 0, amount: 5 },
      { op: 'take', dtMs: 0, amount: 4 },
      { op: 'charge', dtMs: 0, amount: 1 },
      { op: 'return', dtMs: 0, amount: 3 },
      { op: 'return', dtMs: 0, amount: 9 },
    ]);
    expect(got).toEqual(model);
    // 10 tokens: a grant of 4, 5 spent directly, the next grant gets the last 1, nothing to charge; 3 handed
    // back fit; of 9 more only 7 fit under the capacity (the bucket never holds more than 10).
    expect(got).toEqual([
      { granted: 4 * MICRO, remaining: 6 * MICRO, refillMs: 0 },
      expect.objectContaining({
        allowed: true,
        results: [expect.objectContaining({ remaining: 1 * MICRO })],
      }),
      { granted: 1 * MICRO, remaining: 0, refillMs: -1 },
      expect.objectContaining({ allowed: false }),
      { credited: 3 * MICRO, dropped: 0, tokens: 3 * MICRO },
      { credited: 7 * MICRO, dropped: 2 * MICRO, tokens: 10 * MICRO },
    ]);
  });

  it('a return to a bucket that expired (full) drops everything', async () => {
    const key = `rl:v1:{${uniquePrefix('grant')}}:p`;
    const { model, redis: got } = await run(key, 10, 1, [{ op: 'return', dtMs: 0, amount: 2 }]);
    expect(got).toEqual(model);
    expect(got).toEqual([{ credited: 0, dropped: 2 * MICRO, tokens: 10 * MICRO }]);
    expect(await redis.exists(key)).toBe(0);
  });

  it('random sequences of charges, takes and returns: identical replies', async () => {
    const op = fc.record({
      op: fc.constantFrom('charge' as const, 'take' as const, 'return' as const),
      dtMs: fc.integer({ min: 0, max: 3000 }),
      amount: fc.integer({ min: 1, max: 12_000_000 }).map((m) => m / MICRO),
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

  it('refuses bad arguments before it reads or writes anything', async () => {
    const key = `rl:v1:{${uniquePrefix('grant-bad')}}:p`;
    const good = ['1', '1000000', '10000000', '1', '60000', '0', '0', '0'];
    const bad: [number, string][] = [
      [0, '3'],
      [1, '0'],
      [1, '1.5'],
      [2, '-1'],
      [3, 'nan'],
      [4, '0'],
      [5, '-1'],
    ];
    for (const [at, value] of bad) {
      const argv = [...good];
      argv[at] = value;
      await expect(scripts.qpGrantAt(1, key, ...argv, String(EPOCH))).rejects.toThrow(/QP_BADARG/);
    }
    await expect(scripts.qpGrantAt(1, key, ...good.slice(1), String(EPOCH))).rejects.toThrow(/QP_BADARG/);
    expect(await redis.exists(key)).toBe(0);
  });
});
