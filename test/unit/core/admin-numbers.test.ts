/** Numbers of admin answers: no float noise, shares and amounts rounded down, rates to nearest. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  floorAmount,
  floorTo,
  roundAmount,
  roundDerivedRate,
  roundShare,
  roundShares,
} from '../../../core/admin-numbers.js';
import { policyView } from '../../../core/wire/admin.js';
import { parsePolicy, PolicySpec } from '../../../core/policy/policy.js';

describe('admin numbers', () => {
  it('prints shares without float noise, rounded down to 4 decimals', () => {
    expect(roundShare(0.020000000000000004)).toBe(0.02);
    expect(roundShare(0.6)).toBe(0.6);
    expect(roundShare(0.1 * 6)).toBe(0.6); // 0.6000000000000001
    expect(roundShare(0.5999999999999999)).toBe(0.5999); // below the number 0.6: never shown above it
    expect(roundShare(0.3 - 1e-11)).toBe(0.2999);
    expect(roundShare(1 / 3)).toBe(0.3333);
    expect(roundShare(0.66669)).toBe(0.6666);
    expect(roundShare(1)).toBe(1);
    expect(roundShare(0)).toBe(0);
  });

  it('never shows shares summing above the shares in force', () => {
    const shares = { us: 1 / 3, eu: 1 / 3, ap: 1 / 3 };
    const shown = Object.values(roundShares(shares));
    expect(shown).toEqual([0.3333, 0.3333, 0.3333]);
    expect(shown.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1);
    for (let i = 0; i < 1000; i++) {
      const a = ((i * 7919) % 10007) / 10007;
      const b = ((1 - a) * ((i * 104729) % 1009)) / 1009;
      const c = 1 - a - b;
      expect(roundShare(a) + roundShare(b) + roundShare(c)).toBeLessThanOrEqual(1 + 1e-12);
    }
  });

  it('rounds amounts down to 3 decimals and rates to nearest', () => {
    expect(floorAmount(90 * 0.3333)).toBe(29.997);
    expect(floorAmount(7 / 3)).toBe(2.333);
    expect(floorAmount(0.1 * 0.6)).toBe(0.06);
    expect(roundAmount(0.0005)).toBe(0.001);
    expect(roundAmount(172.79999999999998)).toBe(172.8);
  });

  it('floors exactly: never above the value, and the next decimal up is above it', () => {
    const decimals = fc.constantFrom(3, 4);
    const check = (value: number, d: number) => {
      const shown = floorTo(value, d);
      const scale = 10 ** d;
      const n = Math.round(shown * scale);
      expect(shown).toBe(n / scale); // a decimal of d places, printed without noise
      expect(shown).toBeLessThanOrEqual(value);
      expect((n + 1) / scale).toBeGreaterThan(value);
    };
    fc.assert(fc.property(fc.double({ min: 0, max: 1e9, noNaN: true }), decimals, check));
    // Values a hair below, at and above a decimal, where the product value × scale rounds across an integer.
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 10_000_000 }),
        fc.double({ min: -1e-9, max: 1e-9, noNaN: true }),
        decimals,
        (k, hair, d) => check(Math.max(0, k / 10 ** d + hair), d),
      ),
      { numRuns: 20_000 },
    );
  });

  it("shows a sliding log's derived rate rounded, never as 0, and takes it back in a policy body", () => {
    expect(roundDerivedRate(5 / 600)).toBe(0.00833);
    expect(roundDerivedRate(1 / 86_400)).toBe(0.0000116);
    expect(roundDerivedRate(100 / 60)).toBe(1.667);
    expect(roundDerivedRate(2)).toBe(2);
    const log = parsePolicy({ name: 'login', kind: 'sliding_log', capacity: 5, windowSeconds: 600 });
    expect(log.refillPerSecond).toBe(5 / 600); // enforcement keeps the exact rate
    expect(policyView(log).refillPerSecond).toBe(0.00833);
    const { name: _name, ...body } = policyView(log);
    expect(PolicySpec.safeParse(body).success).toBe(true);
    expect(PolicySpec.safeParse({ ...body, refillPerSecond: 0.008 }).success).toBe(false);
    const bucket = parsePolicy({ name: 'b', capacity: 5, refillPerSecond: 0.02777 });
    expect(policyView(bucket)).toEqual(bucket); // an operator's own rate is shown as written
  });

  it("shows a derived kind's class rates rounded like the policy's, and takes them back in a policy body", () => {
    for (const [input, shown] of [
      [{ kind: 'sliding_log', capacity: 5, windowSeconds: 600, classes: { gold: { capacity: 7 } } }, 0.0117],
      [{ kind: 'daily', capacity: 1000, classes: { gold: { capacity: 7 } } }, 0.000081],
      [{ kind: 'concurrency', capacity: 10, leaseSeconds: 7, classes: { gold: { capacity: 7 } } }, 1],
    ] as const) {
      const policy = parsePolicy({ name: 'p', ...input });
      const exact = policy.classes!['gold']!.refillPerSecond;
      expect(exact).toBe(input.kind === 'daily' ? 7 / 86_400 : input.kind === 'concurrency' ? 1 : 7 / 600);
      const view = policyView(policy);
      expect(view.classes!['gold']!.refillPerSecond, input.kind).toBe(shown);
      // The view sent back (GET → PUT) parses, to the same exact rates.
      const { name: _name, ...body } = view;
      const back = PolicySpec.safeParse(body);
      expect(back.success, JSON.stringify(back.error?.issues)).toBe(true);
      expect(back.data!.classes!['gold']!.refillPerSecond).toBe(exact);
      // The exact rate is taken too; any other rate is not.
      const classes = (refillPerSecond: number) => ({ gold: { capacity: 7, refillPerSecond } });
      expect(PolicySpec.safeParse({ ...body, classes: classes(exact) }).success).toBe(true);
      const wrong = PolicySpec.safeParse({ ...body, classes: classes(exact * 2) });
      expect(wrong.error?.issues.map((i) => i.path.join('.'))).toEqual(['classes.gold.refillPerSecond']);
    }
  });
});
