import { describe, expect, it } from 'vitest';
import { refundCases, runRefundCaseOnModel } from '../../../cases/refund-cases.js';

describe('refund model: the case table', () => {
  for (const c of refundCases) {
    it(c.name, () => {
      const { problems } = runRefundCaseOnModel('unit', c);
      expect(problems).toEqual([]);
    });
  }
});
