/**
 * A grant that arrives after its borrow stopped waiting (regional-agent/borrowing/borrower.ts): the lender took
 * the tokens, so the borrower credits them to the bucket all the same, as far as it believes the grant, instead
 * of losing them. The asker is a fake that answers `timeout` and hands the grant over afterwards, as the NATS
 * asker does with a reply that crossed the link too slowly.
 */
import { describe, expect, it } from 'vitest';
import {
  BorrowPlanner,
  DEFAULT_BORROW_PLANNER,
  type LoanAnswer,
} from '../../../../core/borrowing/planner.js';
import { ManualClock } from '../../../../core/clock.js';
import { bucketKey } from '../../../../core/keys.js';
import type { EncodedCredit } from '../../../../core/models/transfer.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { sizedBucket } from '../../../../core/shares/share-sizing.js';
import type { ShareView } from '../../../../core/shares/shares.js';
import type { LoanRequest } from '../../../../core/wire/loan.js';
import { Registry } from 'prom-client';
import { borrowMetrics } from '../../../../regional-agent/borrowing/borrow-metrics.js';
import { Borrower } from '../../../../regional-agent/borrowing/borrower.js';

type Grant = Extract<LoanAnswer, { kind: 'grant' }>;

function setup() {
  const clock = new ManualClock(1_750_000_000_000);
  const policy = parsePolicy({ name: 'api', capacity: 10, refillPerSecond: 1 });
  const epoch = { now: 1 };
  const shares: ShareView = {
    shareFor: () => ({ share: 0.5, epoch: epoch.now }),
    enter: () => () => undefined,
    regionShares: () => ({ us: 0.5, eu: 0.5 }),
    regionCeilings: () => ({ us: 0.5, eu: 0.5 }),
  };
  const credits: EncodedCredit[] = [];
  const asked: LoanRequest[] = [];
  let late: ((answer: Grant) => void) | undefined;
  const planner = new BorrowPlanner(DEFAULT_BORROW_PLANNER);
  const registry = new Registry();
  const metrics = borrowMetrics(registry, planner);
  const borrower = new Borrower({
    region: 'us',
    planner,
    metrics,
    shares,
    store: {
      lend: () => Promise.reject(new Error('not a lender here')),
      credit: (c) => {
        credits.push(c);
        return Promise.resolve({ credited: c.amount, dropped: 0, tokens: c.amount });
      },
    },
    // No answer within the wait; the grant comes after it.
    ask: (_lender, request, _deadlineAt, onLate) => {
      asked.push(request);
      late = onLate;
      return Promise.resolve({ kind: 'timeout', waitedMs: 300 });
    },
    clock,
    monotonic: () => clock.now(),
    reserveMs: 10,
    lowWater: 0,
    topUpMs: 300,
  });
  const check = {
    policy,
    subject: 'alice',
    bucket: sizedBucket(policy, bucketKey(policy.version, 'alice', 'api'), 1, 0.5),
  };
  const refuse = () => borrower.cover([{ check, remaining: 0 }], clock.now() + 250);
  const grant = (grantedMicros: number): Grant => ({
    kind: 'grant',
    grant: { grantedMicros, remainingMicros: 0, refillMs: 1000 },
    rttMs: 400,
  });
  /** Tokens counted in quotaplane_borrow_tokens_dropped_total, by reason. */
  const dropped = async () =>
    Object.fromEntries(
      (await metrics.droppedTokens.get()).values.map((v) => [String(v.labels['reason']), v.value]),
    );
  return { borrower, credits, asked, refuse, grant, late: () => late, clock, epoch, dropped };
}

describe('Borrower: a grant that arrives after the borrow stopped waiting', () => {
  it('is credited to the bucket, and the next decision of the subject sees it', async () => {
    const { borrower, credits, asked, refuse, grant, late, dropped } = setup();
    const outcome = await refuse();
    // The one lender did not answer in time: the refusal stands.
    expect(outcome.covered).toBe(false);
    expect(asked.map((r) => [r.mode, r.amountMicros])).toEqual([['fill', 5_000_000]]);
    expect(credits).toEqual([]);
    expect(borrower.generation('api', 'alice')).toBe(0);
    // Then the grant arrives: the lender took 3 tokens, and they reach the bucket.
    late()!(grant(3_000_000));
    await new Promise((resolve) => setImmediate(resolve));
    expect(credits.map((c) => [c.key, c.amount])).toEqual([[bucketKey(1, 'alice', 'api'), 3_000_000]]);
    expect(borrower.generation('api', 'alice')).toBe(1);
    expect(await dropped()).toEqual({});
  });

  it('is believed as an answer in time would be: above what was asked, nothing is credited', async () => {
    const { credits, refuse, grant, late } = setup();
    await refuse();
    late()!(grant(5_000_001));
    await new Promise((resolve) => setImmediate(resolve));
    expect(credits).toEqual([]);
  });

  it('is dropped when the share has moved since the ask: the bucket parameters of the refusal no longer hold', async () => {
    const { borrower, credits, refuse, grant, late, epoch, dropped } = setup();
    await refuse();
    // A shrink and regrowth came meanwhile: crediting with the old share's rate and no floor would mint tokens.
    epoch.now = 2;
    late()!(grant(3_000_000));
    await new Promise((resolve) => setImmediate(resolve));
    expect(credits).toEqual([]);
    expect(borrower.generation('api', 'alice')).toBe(0);
    // Counted as lent but not credited, and why.
    expect(await dropped()).toEqual({ share_moved: 3 });
  });
});
