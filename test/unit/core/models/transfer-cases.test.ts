import { describe, expect, it } from 'vitest';
import { runTransferCaseOnModel, transferCases } from '../../../cases/transfer-cases.js';

describe('transfer model (lend, credit): the case table', () => {
  for (const c of transferCases) {
    it(c.name, () => {
      const { problems } = runTransferCaseOnModel('unit', c);
      expect(problems).toEqual([]);
    });
  }
});
