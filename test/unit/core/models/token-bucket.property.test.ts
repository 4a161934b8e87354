/**
 * Properties of the reference model over arbitrary call sequences (fast-check). The Lua script agrees with the
 * model on the shared case table, so these properties carry over to it.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  MICRO,
  BucketModel,
  refill,
  type EncodedCheck,
  type StoredBucket,
} from '../../../../core/models/token-bucket.js';

const EPOCH = 1_750_000_000_000_000;
const KEY = 'rl:v1:{p}:x';

function check(capacity: number, rate: number, cost: number): EncodedCheck {
  return { capacity, rate, cost, ttlMs: 3_600_000_000, floorBefore: 0, floorRate: 0, floorCapacity: 0 };
}

/** A call: µs since the previous call (sometimes negative: a clock step), and its cost in micro-tokens. */
const call = fc.record({
  dt: fc.oneof(
    { weight: 8, arbitrary: fc.integer({ min: 0, max: 2_000_000 }) },
    { weight: 1, arbitrary: fc.integer({ min: -500_000, max: 0 }) },
  ),
  cost: fc.integer({ min: 1, max: 5 * MICRO }),
});

describe('token bucket model properties', () => {
  it('never admits more than C + R·t over any interval', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 20 }).map((c) => c * MICRO),
        fc.double({ min: 0.01, max: 50, noNaN: true }),
        fc.array(call, { minLength: 1, maxLength: 120 }),
        (capacity, rate, calls) => {
          const model = new BucketModel();
          let now = EPOCH;
          let clock = -Infinity; // the bucket's own clock never runs backwards
          const admitted: { at: number; cost: number }[] = [];
          for (const c of calls) {
            now += c.dt;
            clock = Math.max(clock, now);
            const reply = model.evaluate(
              { keys: [KEY], checks: [check(capacity, rate, c.cost)], dryRun: false },
              now,
            );
            if (reply.allowed) admitted.push({ at: clock, cost: c.cost });
          }
          for (let i = 0; i < admitted.length; i++) {
            let sum = 0;
            for (let j = i; j < admitted.length; j++) {
              sum += admitted[j]!.cost;
              const window = admitted[j]!.at - admitted[i]!.at;
              expect(sum).toBeLessThanOrEqual(capacity + rate * window);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('keeps tokens within [0, capacity] whatever the sequence of calls, rates and capacities', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            dt: call.map((c) => c.dt),
            cost: fc.integer({ min: 1, max: 30 * MICRO }),
            capacity: fc.integer({ min: 0, max: 20 }).map((c) => c * MICRO),
            rate: fc.double({ min: 0, max: 100, noNaN: true }),
            dry: fc.boolean(),
          }),
          { minLength: 1, maxLength: 80 },
        ),
        (calls) => {
          const model = new BucketModel();
          let now = EPOCH;
          for (const c of calls) {
            now += c.dt;
            const reply = model.evaluate(
              { keys: [KEY], checks: [check(c.capacity, c.rate, c.cost)], dryRun: c.dry },
              now,
            );
            const remaining = reply.results[0]!.remaining;
            expect(remaining).toBeGreaterThanOrEqual(0);
            expect(remaining).toBeLessThanOrEqual(c.capacity);
            expect(Number.isInteger(remaining)).toBe(true);
            const stored = model.peek(KEY, now);
            if (stored !== undefined) {
              expect(stored.tokens).toBeGreaterThanOrEqual(0);
              expect(stored.tokens).toBeLessThanOrEqual(stored.capacity);
              expect(stored.carry).toBeGreaterThanOrEqual(0);
              expect(stored.carry).toBeLessThan(1);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('a rate or capacity change never mints: the refilled bucket holds no more than without the change', () => {
    const stored = fc.record({
      capacity: fc.integer({ min: 0, max: 1000 * MICRO }),
      tokensFraction: fc.double({ min: 0, max: 1, noNaN: true }),
      carry: fc.double({ min: 0, max: 0.999999, noNaN: true }),
      rate: fc.double({ min: 0, max: 1000, noNaN: true }),
    });
    fc.assert(
      fc.property(
        stored,
        fc.integer({ min: 0, max: 10 * MICRO * 60 }),
        fc.integer({ min: 0, max: 2000 * MICRO }),
        fc.double({ min: 0, max: 2000, noNaN: true }),
        (s, elapsed, newCapacity, newRate) => {
          const bucket: StoredBucket = {
            tokens: Math.floor(s.capacity * s.tokensFraction),
            carry: s.carry,
            ts: EPOCH,
            rate: s.rate,
            capacity: s.capacity,
          };
          const unchanged = refill(bucket, check(s.capacity, s.rate, 1), EPOCH + elapsed);
          const changed = refill(bucket, check(newCapacity, newRate, 1), EPOCH + elapsed);
          expect(changed.tokens).toBeLessThanOrEqual(unchanged.tokens);
        },
      ),
      { numRuns: 1000 },
    );
  });

  it('an expired bucket is exactly a full one, never more', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 100 }).map((c) => c * MICRO),
        fc.double({ min: 0.01, max: 100, noNaN: true }),
        fc.integer({ min: 1, max: 10_000 }),
        (capacity, rate, ttlMs) => {
          const model = new BucketModel();
          const c = { ...check(capacity, rate, 1), ttlMs };
          model.evaluate({ keys: [KEY], checks: [c], dryRun: false }, EPOCH);
          expect(model.peek(KEY, EPOCH + ttlMs * 1000 - 1)).toBeDefined();
          expect(model.peek(KEY, EPOCH + ttlMs * 1000)).toBeUndefined();
          const after = model.evaluate({ keys: [KEY], checks: [c], dryRun: true }, EPOCH + ttlMs * 1000);
          expect(after.results[0]!.remaining).toBe(capacity - 1);
        },
      ),
    );
  });
});
