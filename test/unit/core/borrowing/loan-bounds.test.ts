import { describe, expect, it } from 'vitest';
import { GrantCheck, LendBudget, lenderBound } from '../../../../core/borrowing/loan-bounds.js';

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

  it('gives the shadow back the refill of the exchange: a full lender drained by every loan is believed whole', () => {
    // The lender is full (20) and gives all it holds on every ask; each answer takes 300 ms, and the lender
    // debits somewhere in between. Asked every 2 s, it holds 20 then 2 + what it refilled since its last debit.
    const check = new GrantCheck(100);
    const ask = (granted: number, sentAt: number, now: number) =>
      check.check('eu', 'p', 's', { mode: 'fill', asked: 50 * M, granted }, bound, now, sentAt);
    expect(ask(20 * M, 0, 300)).toEqual({ believed: 20 * M });
    // Debited at 0 at the earliest, it may hold 0.3 at 300; asked again at 2000 and debited at once: 2 tokens.
    expect(ask(2 * M, 2000, 2300)).toEqual({ believed: 2 * M });
    // Debited at 2000, then at 4250 (late in its exchange): 2.25 tokens, believed whole.
    expect(ask(2.25 * M, 4000, 4300)).toEqual({ believed: 2.25 * M });
    // Never more than it could have had: at most 0.05 left at 4300, then 2 tokens to 6300 (sent at 6000).
    expect(ask(3 * M, 6000, 6300)).toEqual({ believed: 2_050_000, problem: 'over_bound' });
    // Asks that overlap count no stretch of time twice: sent at 6100, before the last arrival (6300), answered
    // at 6400: the last grant took all it could hold, so 0.1 token, the refill since 6300.
    expect(ask(M, 6100, 6400)).toEqual({ believed: 100_000, problem: 'over_bound' });
    // Without the send time (the arrival taken for it), the exchange is not given back.
    const bare = new GrantCheck(100);
    bare.check('eu', 'p', 's', { mode: 'fill', asked: 50 * M, granted: 20 * M }, bound, 300);
    expect(bare.check('eu', 'p', 's', { mode: 'fill', asked: 50 * M, granted: 2 * M }, bound, 2300)).toEqual({
      believed: 2 * M,
    });
    expect(
      bare.check('eu', 'p', 's', { mode: 'fill', asked: 50 * M, granted: 2.25 * M }, bound, 4300),
    ).toEqual({
      believed: 2 * M,
      problem: 'over_bound',
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
