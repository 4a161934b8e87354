import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { runBorrow, type BorrowPorts } from '../../../../core/borrowing/borrow.js';
import {
  BorrowPlanner,
  MAX_DRY_MEMORY_LIMIT,
  MAX_DRY_MS,
  MIN_ASK_INTERVAL_MS,
  type BorrowNeed,
  type LoanAnswer,
  type LoanAsk,
} from '../../../../core/borrowing/planner.js';
import { creditOnModel, lendOnModel, transferBucket } from '../../../../core/models/transfer.js';
import { encodeRequest } from '../../../../core/wire/bucket.js';
import { BucketModel, MICRO } from '../../../../core/models/token-bucket.js';

const settings = { maxLenders: 4, maxEntries: 100, unreachableBackoffMs: 5000 };
const third = 1 / 3;

function need(over: Partial<BorrowNeed> = {}): BorrowNeed {
  return {
    policy: 'p',
    subject: 's',
    capacity: 60,
    refillPerSecond: 1,
    borrower: 'us',
    shares: { us: third, eu: third, ap: third },
    mode: 'fill',
    needMicros: 1 * MICRO,
    wantMicros: 20 * MICRO,
    ...over,
  };
}

const grant = (grantedMicros: number, remainingMicros: number, refillMs: number | null = 0): LoanAnswer => ({
  kind: 'grant',
  grant: { grantedMicros, remainingMicros, refillMs },
});

describe('BorrowPlanner: order and amounts', () => {
  it('asks lenders never heard of as full, largest first, and splits the room in proportion to their stock', () => {
    const planner = new BorrowPlanner(settings);
    const plan = planner.plan(need({ shares: { us: 0.2, eu: 0.3, ap: 0.5 }, wantMicros: 40 * MICRO }), 0);
    // 40 of the 48 they hold: 30/48 of it from ap, 18/48 from eu.
    expect(plan.asks).toEqual([
      { lender: 'ap', mode: 'fill', amountMicros: 25 * MICRO, expectedMicros: 30 * MICRO },
      { lender: 'eu', mode: 'fill', amountMicros: 15 * MICRO, expectedMicros: 18 * MICRO },
    ]);
    expect(plan.held).toEqual([]);
    expect(plan.dry).toEqual([]);
  });

  it('never asks the borrower itself or a region without a share', () => {
    const planner = new BorrowPlanner(settings);
    const plan = planner.plan(need({ shares: { us: 0.5, eu: 0.5, ap: 0 } }), 0);
    expect(plan.asks.map((a) => a.lender)).toEqual(['eu']);
  });

  it('gives what no expectation covers to the first lender', () => {
    const planner = new BorrowPlanner(settings);
    const plan = planner.plan(need({ wantMicros: 50 * MICRO }), 0);
    expect(plan.asks.map((a) => [a.lender, a.amountMicros / MICRO])).toEqual([
      ['ap', 30],
      ['eu', 20],
    ]);
  });

  it('expects a lender to hold what it said it had left plus its refill since, capped at its burst', () => {
    const planner = new BorrowPlanner(settings);
    const n = need();
    planner.record(
      n,
      { lender: 'eu', mode: 'fill', amountMicros: 5 * MICRO, expectedMicros: 0 },
      grant(5 * MICRO, 2 * MICRO, 9000),
      0,
    );
    // eu refills at 1/3 token/s: 3 s later it is expected to hold 2 + 1 = 3 tokens; ap, never heard of, 20.
    const plan = planner.plan({ ...n, wantMicros: 40 * MICRO }, 3000);
    expect(plan.asks.map((a) => [a.lender, Math.round(a.expectedMicros / 1000) / 1000])).toEqual([
      ['ap', 20],
      ['eu', 3],
    ]);
    expect(
      planner.plan({ ...n, wantMicros: 40 * MICRO }, 10_000_000).asks.find((a) => a.lender === 'eu')
        ?.expectedMicros,
    ).toBe(20 * MICRO);
  });

  it('asks at most maxLenders per round and says who was held back', () => {
    const planner = new BorrowPlanner({ ...settings, maxLenders: 1 });
    const plan = planner.plan(need(), 0);
    expect(plan.asks.map((a) => a.lender)).toEqual(['ap']);
    expect(plan.held).toEqual(['eu']);
  });

  it('spend asks one lender for exactly the cost, and skips lenders whose burst can never hold it', () => {
    const planner = new BorrowPlanner(settings);
    const plan = planner.plan(
      need({
        mode: 'spend',
        needMicros: 25 * MICRO,
        wantMicros: 25 * MICRO,
        shares: { us: 0.1, eu: 0.3, ap: 0.6 },
      }),
      0,
    );
    expect(plan.asks).toEqual([
      { lender: 'ap', mode: 'spend', amountMicros: 25 * MICRO, expectedMicros: 36 * MICRO },
    ]);
    expect(plan.dry).toEqual(['eu']);
  });
});

describe('BorrowPlanner: dry memory', () => {
  it('a lender that gave less than asked is dry until its refill could cover the need', () => {
    const planner = new BorrowPlanner(settings);
    const n = need({ shares: { us: 0.5, eu: 0.5 }, needMicros: 2 * MICRO });
    planner.record(
      n,
      { lender: 'eu', mode: 'fill', amountMicros: 10 * MICRO, expectedMicros: 0 },
      grant(0, 0, 30_000),
      1000,
    );
    // 2 tokens at 0.5 token/s: 4 s.
    expect(planner.plan(n, 4999).dry).toEqual(['eu']);
    expect(planner.plan(n, 5000).dry).toEqual([]);
    expect(planner.plan(n, 5000).asks.map((a) => a.lender)).toEqual(['eu']);
  });

  it('crumbs left in several regions add up: lenders are asked when together they cover the need', () => {
    const planner = new BorrowPlanner(settings);
    const n = need({ needMicros: 1.5 * MICRO });
    for (const lender of ['eu', 'ap'])
      planner.record(
        n,
        { lender, mode: 'fill', amountMicros: 10 * MICRO, expectedMicros: 0 },
        grant(MICRO, 0.6 * MICRO, 30_000),
        0,
      );
    // A second later each is expected to hold 0.6 + 1/3 ≈ 0.93 token: 1.87 together covers 1.5, not 2.
    expect(planner.plan(n, 1000).asks.map((a) => a.lender)).toEqual(['ap', 'eu']);
    expect(planner.plan({ ...n, needMicros: 2 * MICRO }, 1000).dry).toEqual(['ap', 'eu']);
  });

  it('never remembers a lender dry for longer than it says, nor longer than MAX_DRY_MS', () => {
    const planner = new BorrowPlanner(settings);
    const n = need({ shares: { us: 0.5, eu: 0.5 }, needMicros: 20 * MICRO });
    planner.record(
      n,
      { lender: 'eu', mode: 'fill', amountMicros: 20 * MICRO, expectedMicros: 0 },
      grant(0, 0, 2000),
      0,
    );
    // Its share says 40 s (20 tokens at 0.5 token/s); it said 2 s (its refill is faster than its share's).
    expect(planner.plan(n, 1999).dry).toEqual(['eu']);
    expect(planner.plan(n, 2000).dry).toEqual([]);
    const m = need({ shares: { us: 0.5, ap: 0.5 }, needMicros: 20 * MICRO });
    planner.record(
      m,
      { lender: 'ap', mode: 'fill', amountMicros: 20 * MICRO, expectedMicros: 0 },
      grant(0, 0, null),
      0,
    );
    expect(planner.plan(m, MAX_DRY_MS - 1).dry).toEqual(['ap']);
    expect(planner.plan(m, MAX_DRY_MS).dry).toEqual([]);
  });

  it('an unreachable region is held back for every subject until its backoff ends', () => {
    const planner = new BorrowPlanner(settings);
    planner.record(
      need(),
      { lender: 'eu', mode: 'fill', amountMicros: 1, expectedMicros: 0 },
      { kind: 'unreachable' },
      0,
    );
    const other = need({ subject: 'other' });
    expect(planner.plan(other, 4999).held).toEqual(['eu']);
    expect(planner.plan(other, 5000).held).toEqual([]);
  });

  it('asks a lender that gave less than asked again no sooner than MIN_ASK_INTERVAL_MS, even for a small need', () => {
    const planner = new BorrowPlanner(settings);
    const n = need({ needMicros: 1, wantMicros: 10 * MICRO });
    planner.record(
      n,
      { lender: 'eu', mode: 'fill', amountMicros: 10 * MICRO, expectedMicros: 0 },
      grant(3 * MICRO, 5 * MICRO, 0),
      0,
    );
    // It still holds 5 tokens, more than the need, but it was short a moment ago.
    expect(planner.plan(n, MIN_ASK_INTERVAL_MS - 1).dry).toEqual(['eu']);
    expect(planner.plan(n, MIN_ASK_INTERVAL_MS).dry).toEqual([]);
  });

  it('a top-up (spare) asks only lenders expected to hold its need above their reserve', () => {
    const planner = new BorrowPlanner(settings);
    // Lenders never heard of are full (20 tokens of a 60 burst at a third): 10 above the reserve of 10.
    const top = need({ mode: 'spare', needMicros: 8 * MICRO, wantMicros: 15 * MICRO });
    expect(planner.plan(top, 0).asks).toEqual([
      { lender: 'ap', mode: 'spare', amountMicros: 7.5 * MICRO, expectedMicros: 10 * MICRO },
      { lender: 'eu', mode: 'spare', amountMicros: 7.5 * MICRO, expectedMicros: 10 * MICRO },
    ]);
    // Together they hold 20 above their reserves: a need of 21 asks nobody.
    expect(planner.plan({ ...top, needMicros: 21 * MICRO }, 0).asks).toEqual([]);
  });

  it('a refusal makes the lender dry for this subject only', () => {
    const planner = new BorrowPlanner(settings);
    planner.record(
      need(),
      { lender: 'eu', mode: 'fill', amountMicros: 1, expectedMicros: 0 },
      { kind: 'refused' },
      0,
    );
    expect(planner.plan(need(), 1).dry).toEqual(['eu']);
    expect(planner.plan(need({ subject: 'other' }), 1).dry).toEqual([]);
  });

  it('memory is an LRU bounded by maxEntries: the least recently used entry goes first', () => {
    const planner = new BorrowPlanner({ ...settings, maxEntries: 2 });
    const ask: LoanAsk = { lender: 'eu', mode: 'fill', amountMicros: 10, expectedMicros: 0 };
    const dryAnswer = grant(0, 0, 50_000);
    planner.record(need({ subject: 'a', needMicros: 100 * MICRO }), ask, dryAnswer, 0);
    planner.record(need({ subject: 'b', needMicros: 100 * MICRO }), ask, dryAnswer, 0);
    planner.plan(need({ subject: 'a' }), 1); // touches a: b is now the oldest
    planner.record(need({ subject: 'c', needMicros: 100 * MICRO }), ask, dryAnswer, 0);
    expect(planner.size).toBe(2);
    expect(planner.plan(need({ subject: 'a' }), 1).dry).toEqual(['eu']);
    expect(planner.plan(need({ subject: 'b' }), 1).dry).toEqual([]);
    expect(planner.plan(need({ subject: 'c' }), 1).dry).toEqual(['eu']);
  });

  it('refuses settings out of range instead of capping them', () => {
    expect(() => new BorrowPlanner({ ...settings, maxEntries: MAX_DRY_MEMORY_LIMIT + 1 })).toThrow(
      /maxEntries/,
    );
    expect(() => new BorrowPlanner({ ...settings, maxLenders: 0 })).toThrow(/maxLenders/);
    expect(() => new BorrowPlanner({ ...settings, maxLenders: 17 })).toThrow(/maxLenders/);
    expect(() => new BorrowPlanner({ ...settings, maxEntries: 1.5 })).toThrow(/maxEntries/);
  });
});

describe('BorrowPlanner: single flight', () => {
  it('concurrent borrows of one subject share one run; another subject runs its own; the next call starts afresh', async () => {
    const planner = new BorrowPlanner(settings);
    let runs = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const borrow = async () => {
      runs++;
      await gate;
      return runs;
    };
    const calls = Array.from({ length: 50 }, () => planner.once('p', 's', 'refusal', borrow));
    const other = planner.once('p', 't', 'refusal', borrow);
    expect(planner.inFlight).toBe(2);
    release();
    expect(new Set(await Promise.all(calls)).size).toBe(1);
    await other;
    expect(runs).toBe(2);
    expect(planner.inFlight).toBe(0);
    await planner.once('p', 's', 'refusal', borrow);
    expect(runs).toBe(3);
  });

  it('a refusal does not take a running top-up for its own borrow: it waits for it and is told to decide again', async () => {
    const planner = new BorrowPlanner(settings);
    const order: string[] = [];
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const topUp = planner.once('p', 's', 'top_up', async () => {
      order.push('top_up');
      await gate;
      return 'top_up';
    });
    const fill = () => {
      order.push('refusal');
      return Promise.resolve('refusal');
    };
    const refusals = [planner.once('p', 's', 'refusal', fill), planner.once('p', 's', 'refusal', fill)];
    expect(order).toEqual(['top_up']);
    release();
    expect(await topUp).toBe('top_up');
    expect(await Promise.all(refusals)).toEqual([undefined, undefined]);
    expect(order).toEqual(['top_up']);
    // Decided again and still short: now it borrows.
    expect(await planner.once('p', 's', 'refusal', fill)).toBe('refusal');
  });
});

/** Three regions' buckets of one subject in one model, each sized from its share; a borrow between them. */
function world(capacity: number, refill: number, shares: Record<string, number>) {
  const model = new BucketModel();
  const bucketOf = (region: string) => ({
    key: `rl:v1:{s}:p:${region}`,
    capacity: capacity * shares[region]!,
    refillPerSecond: refill * shares[region]!,
    ttlMs: 3_600_000,
  });
  const decide = (region: string, cost: number, nowUs: number) =>
    model.evaluate(encodeRequest({ checks: [{ ...bucketOf(region), cost }] }), nowUs);
  const ports = (
    borrower: string,
    nowUs: () => number,
    answer?: (lender: string) => LoanAnswer | undefined,
  ): BorrowPorts => ({
    ask: (ask: LoanAsk) => {
      const forced = answer?.(ask.lender);
      if (forced !== undefined) return Promise.resolve(forced);
      const b = bucketOf(ask.lender);
      const r = lendOnModel(
        model,
        { key: b.key, bucket: transferBucket(b), mode: ask.mode, amount: ask.amountMicros },
        nowUs(),
      );
      return Promise.resolve({
        kind: 'grant',
        grant: {
          grantedMicros: r.granted,
          remainingMicros: r.remaining,
          refillMs: r.refillMs < 0 ? null : r.refillMs,
        },
      });
    },
    credit: (granted: number) => {
      const b = bucketOf(borrower);
      const r = creditOnModel(model, { key: b.key, bucket: transferBucket(b), amount: granted }, nowUs());
      return Promise.resolve({ credited: r.credited, dropped: r.dropped });
    },
    now: () => nowUs() / 1000,
  });
  return { model, bucketOf, decide, ports };
}

describe('runBorrow on the model: a homed subject gets its global burst, and no more', () => {
  it('one subject calling only us: 60 admitted of {capacity 60}, then subject_exhausted', async () => {
    const shares = { us: third, eu: third, ap: third };
    const w = world(60, 1e-9, shares);
    const planner = new BorrowPlanner(settings);
    const now = 1_750_000_000_000_000;
    let admitted = 0;
    let last = '';
    for (let i = 0; i < 80; i++) {
      let d = w.decide('us', 1, now);
      if (!d.allowed) {
        const remaining = d.results[0]!.remaining;
        const cap = transferBucket(w.bucketOf('us')).capacity;
        const result = await runBorrow(
          planner,
          need({
            shares,
            capacity: 60,
            refillPerSecond: 1e-9,
            needMicros: MICRO - remaining,
            wantMicros: cap - remaining,
          }),
          w.ports('us', () => now),
          Infinity,
        );
        last = result.outcome;
        if (result.outcome === 'covered') d = w.decide('us', 1, now);
      }
      if (d.allowed) admitted++;
    }
    expect(admitted).toBe(60);
    expect(last).toBe('subject_exhausted');
  });

  it('an unreachable lender makes it share_exhausted, not subject_exhausted', async () => {
    const shares = { us: third, eu: third, ap: third };
    const w = world(60, 1e-9, shares);
    const planner = new BorrowPlanner(settings);
    const now = 1_750_000_000_000_000;
    for (let i = 0; i < 20; i++) w.decide('us', 1, now);
    const ports = w.ports(
      'us',
      () => now,
      (lender) => (lender === 'ap' ? { kind: 'unreachable' } : undefined),
    );
    const n = need({ shares, refillPerSecond: 1e-9, needMicros: MICRO, wantMicros: 20 * MICRO });
    // The room is asked of both, half each: eu gives its 10, ap does not answer and is backed off.
    const first = await runBorrow(planner, n, ports, Infinity);
    expect(first.outcome).toBe('covered');
    expect(first.credited).toBe(10 * MICRO);
    for (let i = 0; i < 10; i++) expect(w.decide('us', 1, now).allowed).toBe(true);
    // eu's other 10 (asked from eu alone: ap is held back).
    const second = await runBorrow(planner, n, ports, Infinity);
    expect(second.outcome).toBe('covered');
    expect(second.asks.map((a) => a.lender)).toEqual(['eu']);
    expect(second.credited).toBe(10 * MICRO);
    for (let i = 0; i < 10; i++) expect(w.decide('us', 1, now).allowed).toBe(true);
    // eu is dry; ap may still hold its 20 but cannot be had: budget may be left elsewhere.
    const third_ = await runBorrow(planner, n, ports, Infinity);
    expect(third_.outcome).toBe('share_exhausted');
  });

  it('property: any interleaving of decisions and borrows keeps Σ stocks ≤ C and admits ≤ C + R·W', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            region: fc.constantFrom('us', 'eu', 'ap'),
            dtMs: fc.integer({ min: 0, max: 3000 }),
            cost: fc.constantFrom(1, 2, 5),
            borrow: fc.boolean(),
          }),
          { minLength: 1, maxLength: 60 },
        ),
        fc.constantFrom<Record<string, number>>(
          { us: 0.5, eu: 0.3, ap: 0.2 },
          { us: third, eu: third, ap: third },
        ),
        async (steps, shares) => {
          const C = 30;
          const R = 2;
          const w = world(C, R, shares);
          const planner = new BorrowPlanner(settings);
          const start = 1_750_000_000_000_000;
          let now = start;
          let admitted = 0;
          for (const step of steps) {
            now += step.dtMs * 1000;
            let d = w.decide(step.region, step.cost, now);
            if (!d.allowed && step.borrow) {
              const remaining = d.results[0]!.remaining;
              const cap = transferBucket(w.bucketOf(step.region)).capacity;
              const cost = step.cost * MICRO;
              const spend = cap < cost;
              const r = await runBorrow(
                planner,
                need({
                  shares,
                  borrower: step.region,
                  capacity: C,
                  refillPerSecond: R,
                  mode: spend ? 'spend' : 'fill',
                  needMicros: spend ? cost : cost - remaining,
                  wantMicros: spend ? cost : Math.max(cost - remaining, cap - remaining),
                }),
                w.ports(step.region, () => now),
                Infinity,
              );
              if (r.spent) admitted += step.cost;
              else if (r.outcome === 'covered') d = w.decide(step.region, step.cost, now);
            }
            if (d.allowed) admitted += step.cost;
            const total = ['us', 'eu', 'ap'].reduce(
              (sum, r) =>
                sum +
                (w.model.peek(w.bucketOf(r).key, now)?.tokens ?? transferBucket(w.bucketOf(r)).capacity),
              0,
            );
            expect(total).toBeLessThanOrEqual(C * MICRO);
            expect(admitted).toBeLessThanOrEqual(C + (R * (now - start)) / 1e6 + 1e-6);
          }
        },
      ),
      { numRuns: 150 },
    );
  });
});
