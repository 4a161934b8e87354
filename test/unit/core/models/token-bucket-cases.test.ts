import { describe, expect, it } from 'vitest';
import { BucketModel } from '../../../../core/models/token-bucket.js';
import { tokenBucketCases } from '../../../cases/token-bucket-cases.js';
import { checkExpectations, prepareCase } from '../../../helpers/case-runner.js';

describe('reference model: shared case table', () => {
  for (const c of tokenBucketCases) {
    it(c.name, () => {
      const model = new BucketModel();
      const problems: string[] = [];
      prepareCase('case', c).forEach(({ step, request, nowMicros }, i) => {
        const reply = model.evaluate(request, nowMicros);
        for (const p of checkExpectations(step, reply)) problems.push(`call ${i}: ${p}`);
      });
      expect(problems).toEqual([]);
    });
  }
});
