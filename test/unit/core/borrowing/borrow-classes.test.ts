/**
 * Borrowing for a subject of a class (docs/subject-classes.md): the loan names the class, so the lender sizes the
 * subject's bucket by the class's limits as the borrower does (core/borrowing/borrow.ts, lender.ts).
 */
import { describe, expect, it } from 'vitest';
import { loanRequest, shortfallNeed } from '../../../../core/borrowing/borrow.js';
import { acceptLoan, loanAnswer, sizeLend } from '../../../../core/borrowing/lender.js';
import { MICRO } from '../../../../core/models/token-bucket.js';
import { parsePolicy, withClass } from '../../../../core/policy/policy.js';
import { LoanRequest } from '../../../../core/wire/loan.js';

const policy = parsePolicy({
  name: 'api',
  capacity: 10,
  refillPerSecond: 1,
  classes: { enterprise: { capacity: 100, refillPerSecond: 10 } },
});
const now = 1_750_000_000_000;

function request(subjectClass: string | undefined) {
  const need = shortfallNeed({
    policy: withClass(policy, subjectClass),
    subject: 'tenant-42',
    subjectClass,
    borrower: 'us',
    shares: { us: 0.5, eu: 0.5 },
    capacityMicros: 50 * MICRO,
    costMicros: MICRO,
    remainingMicros: 0,
  });
  return loanRequest(
    need,
    { lender: 'eu', mode: 'fill', amountMicros: need.wantMicros, expectedMicros: need.wantMicros },
    1,
    now + 500,
    now,
  )!;
}

describe('a loan for a subject of a class', () => {
  it("carries the class, and the lender sizes the subject's bucket by it: 100 × 0.5, refilling at 10 × 0.5", () => {
    const r = request('enterprise');
    expect(r.class).toBe('enterprise');
    expect(LoanRequest.parse(r)).toEqual(r);
    const accepted = acceptLoan(r, policy, now);
    expect('policy' in accepted && accepted.policy.capacity).toBe(100);
    if (!('policy' in accepted)) throw new Error('refused');
    const sized = sizeLend(r, accepted.policy, 0.5, 'rl:v1:tenant-42:api');
    if (!('lend' in sized)) throw new Error('refused');
    expect(sized.lend.bucket.capacity).toBe(50 * MICRO);
    expect(sized.lend.amount).toBe(50 * MICRO);
  });

  it("without a class, the policy's own limits: 10 × 0.5; the request names none", () => {
    const r = request(undefined);
    expect('class' in r).toBe(false);
    const accepted = acceptLoan(r, policy, now);
    if (!('policy' in accepted)) throw new Error('refused');
    expect(accepted.policy).toBe(policy);
    const sized = sizeLend(r, accepted.policy, 0.5, 'rl:v1:tenant-42:api');
    if (!('lend' in sized)) throw new Error('refused');
    expect(sized.lend.bucket.capacity).toBe(5 * MICRO);
  });

  it('a class the lender does not define is refused, taking nothing, and the lender counts as dry', () => {
    const r = { ...request('enterprise'), class: 'platinum' };
    const refused = acceptLoan(r, policy, now);
    expect(refused).toEqual({ error: 'unknown_class', message: 'api has no class platinum here' });
    expect(loanAnswer(refused as { error: 'unknown_class'; message: string })).toEqual({ kind: 'refused' });
    expect(LoanRequest.safeParse({ ...r, class: 'Not A Class' }).success).toBe(false);
  });
});
