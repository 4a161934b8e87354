import { afterAll, describe, expect, it } from 'vitest';
import { parseReply, scriptArguments } from '../../core/bucket-wire.js';
import { BucketModel } from '../../core/token-bucket.js';
import { tokenBucketCases } from '../cases/token-bucket-cases.js';
import { checkExpectations, prepareCase } from '../helpers/case-runner.js';
import { tokenBucketWithClockArg } from '../helpers/lua-test-build.js';
import { sharedRedis, uniquePrefix } from '../harness/fixtures.js';

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
