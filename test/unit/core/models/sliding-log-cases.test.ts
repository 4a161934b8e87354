import { describe, expect, it } from 'vitest';
import { SlidingLogModel } from '../../../../core/models/sliding-log.js';
import {
  checkLogExpectations,
  logKey,
  prepareLogCase,
  slidingLogCases,
} from '../../../cases/sliding-log-cases.js';

describe('sliding-log model: the case table', () => {
  for (const c of slidingLogCases) {
    it(c.name, () => {
      const model = new SlidingLogModel();
      const problems: string[] = [];
      prepareLogCase('p', c).forEach(({ step, request, nowMicros }, i) => {
        const reply = model.evaluate(request, nowMicros);
        const held = step.checks.map((k) => model.entries(logKey('p', k.log), nowMicros).length);
        for (const p of checkLogExpectations(step, reply, held))
          problems.push(`call ${i} (at ${step.at}): ${p}`);
      });
      expect(problems).toEqual([]);
    });
  }
});
