import { describe, expect, it } from 'vitest';
import { GrantCheck, LendBudget, lenderBound } from '../../core/borrowing/loan-bounds.js';

const M = 1e6;

describe('GrantCheck: a borrower believes a grant up to what the lender could have given', () => {
  // A lender holding a third of C = 60, R = 3/s: at most 20 tokens at once, 1 token/s after.
  const bound = lenderBound(60, 3, 1 / 3);

  it('believes a first grant up to the lender’s share of the burst, then its share of the refill since', () => {
    const check = new GrantCheck(100);
    expect(check.check('eu', 'p', 's', { mode: 'fill', asked: 50 * M, granted: 50 * M }, bound, 0)).toEqual({
      believed: 20 * M,
      problem: 'over_bound',
    });
    // 2 s later the lender could have refilled 2 tokens: a grant of 5 is believed for 2.
    expect(check.check('eu', 'p', 's', { mode: 'fill', asked: 5 * M, granted: 5 * M }, bound, 2000)).toEqual({
      believed: 2 * M,
      problem: 'over_bound',
    });
    // Another subject, or another lender, has its own shadow.
    expect(check.check('eu', 'p', 't', { mode: 'fill', asked: 5 * M, granted: 5 * M }, bound, 2000)).toEqual({
      believed: 5 * M,
    });
  });

  it('believes nothing of a grant above what was asked, or of a spend that is not the cost', () => {
    const check = new GrantCheck(100);
    expect(check.check('eu', 'p', 's', { mode: 'fill', asked: 3 * M, granted: 4 * M }, bound, 0)).toEqual({
      believed: 0,
      problem: 'over_asked',
    });
    expect(check.check('eu', 'p', 's', { mode: 'spend', asked: 3 * M, granted: 2 * M }, bound, 0)).toEqual({
      believed: 0,
      problem: 'over_asked',
    });
    // A spend above what the lender could hold is not believed at all (the cost is whole or nothing).
    expect(check.check('eu', 'p', 's', { mode: 'spend', asked: 30 * M, granted: 30 * M }, bound, 0)).toEqual({
      believed: 0,
      problem: 'over_bound',
    });
  });

  it('a region holding no share could have given nothing', () => {
    const check = new GrantCheck(100);
    const none = lenderBound(60, 3, 0);
    expect(check.check('ap', 'p', 's', { mode: 'fill', asked: M, granted: M }, none, 0)).toEqual({
      believed: 0,
      problem: 'over_bound',
    });
  });

  it('keeps at most maxEntries shadows', () => {
    const check = new GrantCheck(10);
    for (let i = 0; i < 100; i++)
      check.check('eu', 'p', `s${i}`, { mode: 'fill', asked: M, granted: M }, bound, 0);
    expect(check.size).toBe(10);
  });
});

describe('LendBudget: what one requesting region may take per policy', () => {
  const policy = { capacity: 10, refillPerSecond: 1 };

  it('reserves up to 16 bursts of the policy, then refills at 16 of its rates; unused reservations come back', () => {
    const budget = new LendBudget(16, 100);
    expect(budget.reserve('eu', 'p', policy, 100 * M, 'fill', 0)).toBe(100 * M);
    expect(budget.reserve('eu', 'p', policy, 100 * M, 'fill', 0)).toBe(60 * M);
    expect(budget.reserve('eu', 'p', policy, 100 * M, 'fill', 0)).toBe(0);
    // Another requesting region has its own budget.
    expect(budget.reserve('ap', 'p', policy, 100 * M, 'fill', 0)).toBe(100 * M);
    // A lend that gave 10 of 60 reserved gives 50 back.
    budget.settle('eu', 'p', 60 * M, 10 * M);
    expect(budget.reserve('eu', 'p', policy, 100 * M, 'fill', 0)).toBe(50 * M);
    // 1 s later: 16 tokens refilled; a spend is whole or nothing.
    expect(budget.reserve('eu', 'p', policy, 17 * M, 'spend', 1000)).toBe(0);
    expect(budget.reserve('eu', 'p', policy, 16 * M, 'spend', 1000)).toBe(16 * M);
  });

  it('keeps at most maxEntries budgets', () => {
    const budget = new LendBudget(16, 5);
    for (let i = 0; i < 50; i++) budget.reserve(`r${i}`, 'p', policy, M, 'fill', 0);
    expect(budget.size).toBe(5);
  });
});
