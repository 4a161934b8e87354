import { afterAll, describe, expect, it } from 'vitest';
import { parseReply, scriptArguments } from '../../../core/wire/bucket.js';
import { parseRefundReply, refundArguments, type EncodedRefundReply } from '../../../core/models/refund.js';
import type { EncodedReply } from '../../../core/models/token-bucket.js';
import { luaSource } from '../../../regional-agent/redis/scripts.js';
import {
  checkRefundStep,
  prepareRefundCase,
  refundCases,
  runRefundCaseOnModel,
} from '../../cases/refund-cases.js';
import { tokenBucketWithClockArg, withClockArg } from '../../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

const redis = sharedRedis();
redis.defineCommand('qpTokenBucketAt', { lua: tokenBucketWithClockArg() });
redis.defineCommand('qpRefundCase', { lua: luaSource('refund') });
// The cases' refunds run at their instants (a deadline is read against the clock).
redis.defineCommand('qpRefundAt', { lua: withClockArg('refund') });
type Scripts = {
  qpTokenBucketAt(n: number, ...a: string[]): Promise<unknown>;
  qpRefundCase(n: number, ...a: string[]): Promise<unknown>;
  qpRefundAt(n: number, ...a: string[]): Promise<unknown>;
};
const scripts = redis as unknown as Scripts;

afterAll(() => redis.disconnect());

describe('lua/refund.lua on a real Redis agrees exactly with core/models/refund.ts', () => {
  for (const c of refundCases) {
    it(c.name, async () => {
      const prefix = uniquePrefix('refund');
      const fromModel = runRefundCaseOnModel(prefix, c);
      const problems: string[] = [];
      const steps = prepareRefundCase(prefix, c);
      for (let i = 0; i < steps.length; i++) {
        const p = steps[i]!;
        let reply: EncodedReply | EncodedRefundReply;
        if (p.kind === 'charge') {
          const { keys, argv } = scriptArguments(p.request);
          const raw = await scripts.qpTokenBucketAt(keys.length, ...keys, ...argv, String(p.nowMicros));
          reply = parseReply(raw, p.request.checks.length);
        } else {
          const { keys, argv } = refundArguments(p.refund);
          reply = parseRefundReply(
            await scripts.qpRefundAt(keys.length, ...keys, ...argv, String(p.nowMicros)),
            p.refund.checks.length,
          );
        }
        expect(reply, `step ${i}`).toEqual(fromModel.replies[i]);
        for (const problem of checkRefundStep(p.step, reply)) problems.push(`step ${i}: ${problem}`);
      }
      expect(problems).toEqual([]);
    });
  }
});

describe('lua/refund.lua refuses malformed calls and changes nothing', () => {
  const bad: [string, string[], string[], RegExp][] = [
    ['zero buckets', ['rl:v1:{x}:a'], ['0', '0'], /bucket count/],
    ['seventeen buckets', ['rl:v1:{x}:a'], ['17', '0'], /bucket count/],
    ['a bad record flag', ['rl:v1:{x}:a'], ['1', '2', '1', '1'], /record flag/],
    ['a missing argument', ['rl:v1:{x}:a'], ['1', '0', '1'], /expected 4 or 5 arguments/],
    [
      'an extra argument',
      ['rl:v1:{x}:a'],
      ['1', '0', '1', '1', '1', '1'],
      /expected 4 or 5 arguments, got 6/,
    ],
    ['a deadline of 0', ['rl:v1:{x}:a'], ['1', '0', '1', '1', '0'], /deadline/],
    ['a fractional deadline', ['rl:v1:{x}:a'], ['1', '0', '1', '1', '1.5'], /deadline/],
    ['a missing record key', ['rl:v1:{x}:a'], ['1', '1', '1', '1'], /expected 2 keys/],
    ['a zero cost', ['rl:v1:{x}:a'], ['1', '0', '0', '1'], /cost of bucket 1/],
    ['a fractional cost', ['rl:v1:{x}:a'], ['1', '0', '1.5', '1'], /cost of bucket 1/],
    ['a negative capacity', ['rl:v1:{x}:a'], ['1', '0', '1', '-1'], /capacity of bucket 1/],
    ['a capacity that is not a number', ['rl:v1:{x}:a'], ['1', '0', '1', 'nan'], /capacity of bucket 1/],
  ];
  for (const [name, keys, argv, message] of bad) {
    it(`refuses ${name}`, async () => {
      const prefix = uniquePrefix('refund-bad');
      const key = `rl:v1:{${prefix}}:a`;
      await redis.hset(key, { tk: 1_000_000, fr: 0, ts: 1, rt: 1, cp: 10_000_000 });
      const realKeys = keys.map(() => key);
      await expect(scripts.qpRefundCase(realKeys.length, ...realKeys, ...argv)).rejects.toThrow(
        new RegExp(`QP_BADARG.*${message.source}`),
      );
      expect(await redis.hget(key, 'tk')).toBe('1000000');
    });
  }
});
