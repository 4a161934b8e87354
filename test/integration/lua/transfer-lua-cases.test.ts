import { afterAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { encodeRequest, parseReply, scriptArguments } from '../../../core/wire/bucket.js';
import { BucketModel } from '../../../core/models/token-bucket.js';
import {
  creditArguments,
  creditOnModel,
  lendArguments,
  lendOnModel,
  LendTooLateError,
  parseCreditReply,
  parseLendReply,
  transferBucket,
} from '../../../core/models/transfer.js';
import {
  checkTransferStep,
  prepareTransferCase,
  runTransferCaseOnModel,
  transferCases,
  TRANSFER_CASE_EPOCH_MICROS,
  type TransferReply,
} from '../../cases/transfer-cases.js';
import { tokenBucketWithClockArg, withClockArg } from '../../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

const redis = sharedRedis();
redis.defineCommand('qpTokenBucketAt', { lua: tokenBucketWithClockArg() });
redis.defineCommand('qpLendAt', { lua: withClockArg('lend') });
redis.defineCommand('qpCreditAt', { lua: withClockArg('credit') });
type Call = (n: number, ...a: string[]) => Promise<unknown>;
const scripts = redis as unknown as { qpTokenBucketAt: Call; qpLendAt: Call; qpCreditAt: Call };

afterAll(() => redis.disconnect());

describe('lua/lend.lua and lua/credit.lua on a real Redis agree exactly with core/models/transfer.ts', () => {
  for (const c of transferCases) {
    it(c.name, async () => {
      const prefix = uniquePrefix('transfer');
      const fromModel = runTransferCaseOnModel(prefix, c);
      const problems: string[] = [];
      const steps = prepareTransferCase(prefix, c);
      for (let i = 0; i < steps.length; i++) {
        const p = steps[i]!;
        const now = String(p.nowMicros);
        let reply: TransferReply;
        if (p.kind === 'charge') {
          const { keys, argv } = scriptArguments(p.request);
          reply = parseReply(
            await scripts.qpTokenBucketAt(keys.length, ...keys, ...argv, now),
            p.request.checks.length,
          );
        } else if (p.kind === 'lend') {
          const { keys, argv } = lendArguments(p.lend);
          reply = parseLendReply(await scripts.qpLendAt(keys.length, ...keys, ...argv, now));
        } else {
          const { keys, argv } = creditArguments(p.credit);
          reply = parseCreditReply(await scripts.qpCreditAt(keys.length, ...keys, ...argv, now));
        }
        expect(reply, `step ${i}`).toEqual(fromModel.replies[i]);
        for (const problem of checkTransferStep(p.step, reply)) problems.push(`step ${i}: ${problem}`);
      }
      expect(problems).toEqual([]);
    });
  }
});

describe('lend deadline and bad arguments', () => {
  const bucket = (prefix: string) => ({
    key: `rl:v1:{${prefix}}:p`,
    capacity: 10,
    refillPerSecond: 1,
    ttlMs: 60_000,
  });

  it('a lend that runs after its deadline takes nothing', async () => {
    const prefix = uniquePrefix('lend-late');
    const b = bucket(prefix);
    const lend = { key: b.key, bucket: transferBucket(b), mode: 'fill' as const, amount: 5_000_000 };
    const late = lendArguments(lend, TRANSFER_CASE_EPOCH_MICROS - 1);
    const raw = await scripts.qpLendAt(1, ...late.keys, ...late.argv, String(TRANSFER_CASE_EPOCH_MICROS));
    expect(() => parseLendReply(raw)).toThrow(LendTooLateError);
    expect(await redis.exists(b.key)).toBe(0);
    const onTime = lendArguments(lend, TRANSFER_CASE_EPOCH_MICROS);
    const reply = parseLendReply(
      await scripts.qpLendAt(1, ...onTime.keys, ...onTime.argv, String(TRANSFER_CASE_EPOCH_MICROS)),
    );
    expect(reply).toEqual({ granted: 5_000_000, remaining: 5_000_000, refillMs: 0 });
    expect(await redis.pttl(b.key)).toBeGreaterThan(50_000);
  });

  const lendBad: [string, string[], RegExp][] = [
    ['a bad mode', ['4', '1', '0', '10', '1', '1000', '0', '0', '0'], /mode/],
    ['a zero amount', ['1', '0', '0', '10', '1', '1000', '0', '0', '0'], /amount/],
    ['a fractional amount', ['1', '1.5', '0', '10', '1', '1000', '0', '0', '0'], /amount/],
    ['a negative capacity', ['1', '1', '0', '-1', '1', '1000', '0', '0', '0'], /capacity/],
    ['a rate that is not a number', ['1', '1', '0', '10', 'nan', '1000', '0', '0', '0'], /rate/],
    ['a zero ttl', ['1', '1', '0', '10', '1', '0', '0', '0', '0'], /ttl/],
    ['a missing argument', ['1', '1', '0', '10', '1', '1000', '0', '0'], /expected 9 arguments/],
  ];
  for (const [name, argv, message] of lendBad) {
    it(`lend refuses ${name} and changes nothing`, async () => {
      const key = `rl:v1:{${uniquePrefix('lend-bad')}}:p`;
      await redis.hset(key, { tk: 7_000_000, fr: 0, ts: 1, rt: 0, cp: 10_000_000 });
      await expect(scripts.qpLendAt(1, key, ...argv, String(TRANSFER_CASE_EPOCH_MICROS))).rejects.toThrow(
        new RegExp(`QP_BADARG.*${message.source}`),
      );
      expect(await redis.hget(key, 'tk')).toBe('7000000');
    });
  }

  const creditBad: [string, string[], RegExp][] = [
    ['a zero amount', ['0', '10', '1', '1000', '0', '0', '0'], /amount/],
    ['a fractional capacity', ['1', '1.5', '1', '1000', '0', '0', '0'], /capacity/],
    ['a negative floor rate', ['1', '10', '1', '1000', '0', '-1', '0'], /floor rate/],
    ['an extra argument', ['1', '10', '1', '1000', '0', '0', '0', '0'], /expected 7 arguments/],
  ];
  for (const [name, argv, message] of creditBad) {
    it(`credit refuses ${name} and changes nothing`, async () => {
      const key = `rl:v1:{${uniquePrefix('credit-bad')}}:p`;
      await redis.hset(key, { tk: 1_000_000, fr: 0, ts: 1, rt: 0, cp: 10_000_000 });
      await expect(scripts.qpCreditAt(1, key, ...argv, String(TRANSFER_CASE_EPOCH_MICROS))).rejects.toThrow(
        new RegExp(`QP_BADARG.*${message.source}`),
      );
      expect(await redis.hget(key, 'tk')).toBe('1000000');
    });
  }
});

describe('random sequences: the scripts and the model agree call for call', () => {
  it('charges, lends and credits on two buckets, with rate and capacity changes', async () => {
    const op = fc.record({
      kind: fc.constantFrom('charge', 'fill', 'spend', 'credit'),
      bucket: fc.constantFrom('a', 'b'),
      dtMs: fc.integer({ min: -20, max: 4000 }),
      amount: fc.constantFrom(0.5, 1, 3, 7, 12),
      capacity: fc.constantFrom(0, 4, 10),
      rate: fc.constantFrom(0, 0.5, 1, 3),
    });
    let round = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 12 }), async (ops) => {
        const prefix = `${uniquePrefix('transfer-prop')}-${round++}`;
        const model = new BucketModel();
        let now = TRANSFER_CASE_EPOCH_MICROS;
        for (const o of ops) {
          now += o.dtMs * 1000;
          const b = {
            key: `rl:v1:{${prefix}}:${o.bucket}`,
            capacity: o.capacity,
            refillPerSecond: o.rate,
            ttlMs: 3_600_000,
          };
          const at = String(now);
          if (o.kind === 'charge') {
            const request = encodeRequest({ checks: [{ ...b, cost: o.amount }] });
            const { keys, argv } = scriptArguments(request);
            const raw = await scripts.qpTokenBucketAt(keys.length, ...keys, ...argv, at);
            expect(parseReply(raw, 1)).toEqual(model.evaluate(request, now));
          } else if (o.kind === 'credit') {
            const credit = { key: b.key, bucket: transferBucket(b), amount: o.amount * 1e6 };
            const { keys, argv } = creditArguments(credit);
            const raw = await scripts.qpCreditAt(1, ...keys, ...argv, at);
            expect(parseCreditReply(raw)).toEqual(creditOnModel(model, credit, now));
          } else {
            const lend = { key: b.key, bucket: transferBucket(b), mode: o.kind, amount: o.amount * 1e6 };
            const { keys, argv } = lendArguments(lend);
            const raw = await scripts.qpLendAt(1, ...keys, ...argv, at);
            expect(parseLendReply(raw)).toEqual(lendOnModel(model, lend, now));
          }
        }
      }),
      { numRuns: 80 },
    );
  });
});
