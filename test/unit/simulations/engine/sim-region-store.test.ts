/**
 * The simulator's region store must decide exactly as core's BucketModel does (which
 * test/integration/lua/token-bucket-lua-cases.test.ts holds to the Lua script on a real Redis): the shared case table
 * and random sequences run through both.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { BucketModel, type EncodedCheck } from '../../../../core/models/token-bucket.js';
import { RegionStore } from '../../../../simulations/engine/region-store.js';
import { tokenBucketCases } from '../../../cases/token-bucket-cases.js';
import { prepareCase } from '../../../helpers/case-runner.js';

/** Cases the store can express: one bucket per call, charged (no dry run), no idempotency record. */
const singleBucketCases = tokenBucketCases.filter((c) =>
  c.steps.every((s) => s.checks.length === 1 && s.dryRun !== true && s.idempotencyKey === undefined),
);

describe('RegionStore agrees with BucketModel', () => {
  it('covers a good part of the shared case table', () => {
    expect(singleBucketCases.length).toBeGreaterThanOrEqual(10);
  });

  for (const c of singleBucketCases) {
    it(`case: ${c.name}`, () => {
      const model = new BucketModel();
      const store = new RegionStore('r');
      const subjects = new Map<string, number>();
      for (const { request, nowMicros } of prepareCase('p', c)) {
        const key = request.keys[0]!;
        if (!subjects.has(key)) subjects.set(key, subjects.size);
        const subject = subjects.get(key)!;
        const fromModel = model.evaluate(request, nowMicros);
        const fromStore = store.decide(subject, request.checks[0]!, nowMicros);
        expect(fromStore).toEqual(fromModel.results[0]);
        expect(store.peek(subject, nowMicros)).toEqual(model.peek(key, nowMicros));
      }
    });
  }

  it('on random sequences of checks, costs, rates, floors and clock steps', () => {
    const step = fc.record({
      subject: fc.integer({ min: 0, max: 2 }),
      dt: fc.oneof(fc.integer({ min: 0, max: 3_000_000 }), fc.integer({ min: -500_000, max: 0 })),
      capacity: fc.integer({ min: 0, max: 20 }).map((t) => t * 1_000_000),
      rate: fc.constantFrom(0, 0.25, 1, 3, 100),
      cost: fc.integer({ min: 1, max: 8 }).map((t) => t * 1_000_000),
      ttlMs: fc.constantFrom(500, 60_000),
      floor: fc.option(
        fc.record({ back: fc.integer({ min: 0, max: 2_000_000 }), rate: fc.constantFrom(0, 0.5) }),
        {
          nil: undefined,
        },
      ),
    });
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 60 }), (steps) => {
        const model = new BucketModel();
        const store = new RegionStore('r');
        let now = 1_750_000_000_000_000;
        for (const s of steps) {
          now += s.dt;
          const check: EncodedCheck = {
            capacity: s.capacity,
            rate: s.rate,
            cost: s.cost,
            ttlMs: s.ttlMs,
            floorBefore: s.floor === undefined ? 0 : now - s.floor.back,
            floorRate: s.floor?.rate ?? 0,
            floorCapacity: s.floor === undefined ? 0 : s.capacity / 2,
          };
          const key = `k${s.subject}`;
          const fromModel = model.evaluate({ keys: [key], checks: [check], dryRun: false }, now);
          expect(store.decide(s.subject, check, now)).toEqual(fromModel.results[0]);
          expect(store.peek(s.subject, now)).toEqual(model.peek(key, now));
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe('RegionStore keys', () => {
  const check: EncodedCheck = {
    capacity: 10_000_000,
    rate: 1,
    cost: 1_000_000,
    ttlMs: 60_000,
    floorBefore: 0,
    floorRate: 0,
    floorCapacity: 0,
  };

  it('expires idle keys after the TTL (an expired bucket is full) and counts the peak of live keys', () => {
    const store = new RegionStore('r');
    for (let s = 0; s < 100; s++) store.decide(s, check, 0);
    expect(store.sweep(59_999_999)).toBe(100);
    store.decide(500, check, 30_000_000);
    expect(store.sweep(60_000_000)).toBe(1);
    // The peak is what the sweeps saw (the engine sweeps every 10 virtual seconds).
    expect(store.peakKeys).toBe(100);
    expect(store.peek(3, 60_000_000)).toBeUndefined();
    expect(store.decide(3, check, 60_000_000).remaining).toBe(9_000_000);
  });

  it('restores a snapshot (writes since lost) or loses everything (every bucket full again)', () => {
    const store = new RegionStore('r');
    for (let i = 0; i < 4; i++) store.decide(1, check, 0);
    const snapshot = store.snapshot();
    for (let i = 0; i < 6; i++) store.decide(1, check, 0);
    expect(store.peek(1, 0)!.tokens).toBe(0);
    store.restore(snapshot);
    expect(store.peek(1, 0)!.tokens).toBe(6_000_000);
    // The snapshot itself is not changed by later decisions.
    store.decide(1, check, 0);
    store.restore(snapshot);
    expect(store.peek(1, 0)!.tokens).toBe(6_000_000);
    store.clear();
    expect(store.peek(1, 0)).toBeUndefined();
    expect(store.decide(1, check, 0).remaining).toBe(9_000_000);
  });
});
