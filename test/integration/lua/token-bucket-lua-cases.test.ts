import { afterAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  encodeRequest,
  parseReplies,
  parseReply,
  scriptArguments,
  scriptCall,
} from '../../../core/wire/bucket.js';
import { DeadlinePassedError } from '../../../core/wire/script.js';
import { idempotencyRecordKey } from '../../../core/keys.js';
import { BucketModel, type EncodedRequest } from '../../../core/models/token-bucket.js';
import { RedisDecisionStore } from '../../../regional-agent/redis/decision-store.js';
import { tokenBucketCases } from '../../cases/token-bucket-cases.js';
import { CASE_EPOCH_MICROS, checkExpectations, prepareCase } from '../../helpers/case-runner.js';
import { describeClaimAgreement } from '../../helpers/claim-agreement.js';
import { tokenBucketWithClockArg } from '../../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

const redis = sharedRedis();
redis.defineCommand('qpTokenBucketAt', { lua: tokenBucketWithClockArg() });
const run = (numKeys: number, ...args: string[]) =>
  (redis as unknown as { qpTokenBucketAt(n: number, ...a: string[]): Promise<unknown> }).qpTokenBucketAt(
    numKeys,
    ...args,
  );

afterAll(() => redis.disconnect());

describe('lua/token_bucket.lua on a real Redis agrees exactly with the model', () => {
  for (const c of tokenBucketCases) {
    it(c.name, async () => {
      const model = new BucketModel();
      const prefix = uniquePrefix('case');
      const problems: string[] = [];
      let i = 0;
      for (const { step, request, nowMicros } of prepareCase(prefix, c)) {
        const { keys, argv } = scriptArguments(request);
        const raw = await run(keys.length, ...keys, ...argv, String(nowMicros));
        const fromRedis = parseReply(raw, request.checks.length);
        const fromModel = model.evaluate(request, nowMicros);
        expect(fromRedis, `call ${i} (at ${step.at} ms)`).toEqual(fromModel);
        for (const p of checkExpectations(step, fromRedis)) problems.push(`call ${i}: ${p}`);
        i++;
      }
      expect(problems).toEqual([]);
    });
  }
});

describe('batched calls: the script and the model agree on random batches', () => {
  it('decides each request of a batch as if it ran alone, in order, at the same instant', async () => {
    const prefix = uniquePrefix('batch');
    const key = (b: number) => `rl:v1:{${prefix}}:b${b}`;
    const request = fc.record({
      buckets: fc.uniqueArray(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 3 }),
      capacity: fc.integer({ min: 0, max: 5 }),
      rate: fc.constantFrom(0, 0.5, 1, 3, 10),
      cost: fc.integer({ min: 1, max: 4 }),
      dryRun: fc.boolean(),
      // Bitmask of the request's buckets that must exist (a subject-creation cap).
      mustExist: fc.integer({ min: 0, max: 7 }),
      idem: fc.option(fc.constantFrom('i1', 'i2'), { nil: undefined }),
      floor: fc.option(
        fc.record({
          ago: fc.integer({ min: 0, max: 2000 }),
          rate: fc.constantFrom(0, 0.5),
          capacity: fc.integer({ min: 0, max: 3 }),
        }),
        { nil: undefined },
      ),
    });
    const calls = fc.array(
      fc.record({
        dtMs: fc.integer({ min: -50, max: 1500 }),
        batch: fc.array(request, { minLength: 1, maxLength: 6 }),
      }),
      { minLength: 1, maxLength: 8 },
    );
    let round = 0;
    await fc.assert(
      fc.asyncProperty(calls, async (sequence) => {
        round++;
        const model = new BucketModel();
        const tag = `${prefix}-${round}`;
        let now = CASE_EPOCH_MICROS;
        for (const { dtMs, batch } of sequence) {
          now += dtMs * 1000;
          const encoded = batch.map((r) =>
            encodeRequest({
              checks: r.buckets.map((b) => ({
                key: `${key(b)}:${tag}`,
                capacity: r.capacity,
                refillPerSecond: r.rate,
                cost: r.cost,
                ttlMs: 3_600_000,
                floor: r.floor && {
                  beforeMicros: now - r.floor.ago * 1000,
                  refillPerSecond: r.floor.rate,
                  capacity: r.floor.capacity,
                },
                mustExist: (r.mustExist & (1 << b)) !== 0,
              })),
              dryRun: r.dryRun,
              idempotency:
                r.idem === undefined
                  ? undefined
                  : { key: idempotencyRecordKey(prefix, `${tag}-${r.idem}`), ttlMs: 3_600_000 },
            }),
          );
          const { keys, argv } = scriptCall(encoded);
          const fromRedis = parseReplies(
            await run(keys.length, ...keys, ...argv, String(now)),
            encoded.map((e) => e.checks.length),
          );
          const fromModel = encoded.map((e) => model.evaluate(e, now));
          expect(fromRedis).toEqual(fromModel);
        }
      }),
      { numRuns: 60 },
    );
  });
});

describe('the call deadline (Redis time)', () => {
  it('a call that runs after its deadline changes nothing; one that runs in time decides', async () => {
    const prefix = uniquePrefix('deadline');
    const bucketKey = `rl:v1:{${prefix}}:p`;
    const idem = idempotencyRecordKey(prefix, 'late');
    const request = encodeRequest({
      checks: [{ key: bucketKey, capacity: 5, refillPerSecond: 1, cost: 2, ttlMs: 60_000 }],
      idempotency: { key: idem, ttlMs: 60_000 },
    });
    const now = CASE_EPOCH_MICROS;
    const late = scriptCall([request], now - 1);
    const raw = await run(late.keys.length, ...late.keys, ...late.argv, String(now));
    expect(raw).toEqual([-1]);
    expect(() => parseReplies(raw, [1])).toThrow(DeadlinePassedError);
    expect(await redis.exists(bucketKey, idem)).toBe(0);

    const onTime = scriptCall([request], now);
    const reply = parseReplies(
      await run(onTime.keys.length, ...onTime.keys, ...onTime.argv, String(now)),
      [1],
    );
    expect(reply[0]).toMatchObject({ allowed: true, results: [{ remaining: 3_000_000 }] });
    expect(await redis.exists(bucketKey, idem)).toBe(2);
  });

  it('refuses a malformed deadline before reading anything', async () => {
    const prefix = uniquePrefix('deadline-bad');
    const request = encodeRequest({
      checks: [{ key: `rl:v1:{${prefix}}:p`, capacity: 5, refillPerSecond: 1, cost: 1, ttlMs: 60_000 }],
    });
    const { keys, argv } = scriptCall([request]);
    argv[1] = '-5';
    await expect(run(keys.length, ...keys, ...argv, String(CASE_EPOCH_MICROS))).rejects.toThrow(
      'QP_BADARG deadline must be >= 0',
    );
    expect(() => scriptCall([request], 1.5)).toThrow(RangeError);
  });
});

// A several-group request's claim marks the plain record key a one-group request of its slot would use
// (regional-agent/decisions/idempotency-claim.ts): the script and the model must both read the mark as another
// request's record, and the claim must find a record there.
const claims = new RedisDecisionStore(redis, { timeoutMs: 5000 });
describeClaimAgreement('token-bucket', () => {
  const prefix = uniquePrefix('claim');
  const { request, nowMicros } = prepareCase(prefix, {
    name: 'one check',
    steps: [{ at: 0, checks: [{ bucket: 'a', capacity: 10, refillPerSecond: 1 }], idempotencyKey: 'k' }],
  })[0]!;
  return {
    request,
    key: request.idempotency!.key,
    nowMicros,
    model: new BucketModel(),
    claims,
    script: async (r: EncodedRequest, now: number) => {
      const { keys, argv } = scriptArguments(r);
      return parseReply(await run(keys.length, ...keys, ...argv, String(now)), r.checks.length);
    },
    untouched: async () => (await redis.exists(`rl:v1:{${prefix}}:a`)) === 0,
  };
});
