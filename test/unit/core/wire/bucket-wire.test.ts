import fc from 'fast-check';
import { DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT } from '../../../../core/keys.js';
import { describe, expect, it } from 'vitest';
import {
  DecideRequest,
  InvalidBucketRequestError,
  decodeReply,
  encodeRequest,
  isTokenCost,
  looksValid,
  MAX_COST,
  MIN_COST,
  TokenCost,
  mergeRepeatedBuckets,
  spreadDecision,
  parseReply,
  scriptArguments,
} from '../../../../core/wire/bucket.js';

const check = { key: 'rl:v1:{s}:p', capacity: 10, refillPerSecond: 2, cost: 1, ttlMs: 60_000 };

describe('bucket wire format', () => {
  it('encodes tokens as micro-tokens: capacities round down, costs round up', () => {
    const e = encodeRequest({ checks: [{ ...check, capacity: 4.35, cost: 0.0000014 }] });
    expect(e.checks[0]).toMatchObject({ capacity: 4_350_000, cost: 2, rate: 2 });
    const shares = encodeRequest({ checks: [{ ...check, capacity: 100 / 3, cost: 1 }] });
    expect(shares.checks[0]!.capacity).toBe(33_333_333);
  });

  it('lays out KEYS and ARGV as the script header says', () => {
    const e = encodeRequest({
      checks: [
        check,
        { ...check, key: 'rl:v1:{s}:q', floor: { beforeMicros: 5, refillPerSecond: 1, capacity: 3 } },
      ],
      idempotency: { key: 'rl:idem:{s}:x', ttlMs: 1000, maxRecords: 7 },
      dryRun: true,
    });
    expect(scriptArguments(e)).toEqual({
      keys: ['rl:v1:{s}:p', 'rl:v1:{s}:q', 'rl:idem:{s}:x', 'rl:idem-index:{s}'],
      argv: [
        '1',
        '0',
        '2',
        '3',
        '1000',
        '7',
        '10000000',
        '2',
        '1000000',
        '60000',
        '0',
        '0',
        '0',
        '10000000',
        '2',
        '1000000',
        '60000',
        '5',
        '1',
        '3000000',
      ],
    });
  });

  it('an idempotency record without its own bound carries the default most records per subject', () => {
    const e = encodeRequest({ checks: [check], idempotency: { key: 'rl:idem:{s}:x', ttlMs: 1000 } });
    expect(scriptArguments(e).argv.slice(2, 6)).toEqual([
      '1',
      '0',
      '1000',
      String(DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT),
    ]);
  });

  it('sends no floor values when no bucket has a floor', () => {
    expect(scriptArguments(encodeRequest({ checks: [check] })).argv).toEqual([
      '1',
      '0',
      '1',
      '0',
      '0',
      '10000000',
      '2',
      '1000000',
      '60000',
    ]);
  });

  it.each([
    [{ checks: [] }, 'checks: Too small: expected array to have >=1 items'],
    [{ checks: Array(17).fill(check) }, 'checks: Too big: expected array to have <=16 items'],
    [{ checks: [{ ...check, cost: 0 }] }, 'checks.0.cost: cost must be at least 0.000001 (one micro-token)'],
    [{ checks: [{ ...check, capacity: -1 }] }, 'checks.0.capacity: Too small: expected number to be >=0'],
    [{ checks: [{ ...check, ttlMs: 0.5 }] }, 'checks.0.ttlMs: Invalid input: expected int, received number'],
    [{ checks: [{ ...check, key: '' }] }, 'checks.0.key: Too small: expected string to have >=1 characters'],
    [
      { checks: [{ ...check, refillPerSecond: Number.NaN }] },
      'checks.0.refillPerSecond: Invalid input: expected number, received NaN',
    ],
  ])('refuses %j before any I/O', (request, message) => {
    let error: unknown;
    try {
      encodeRequest(request);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidBucketRequestError);
    expect((error as InvalidBucketRequestError).issues).toContain(message);
  });

  it('decodes a reply into tokens, with the overall retry-after the largest of the buckets', () => {
    const reply = parseReply([0, 0, 0, 3_500_000, 0, 3000, 0, 0, 2000, 5000], 2);
    expect(decodeReply(reply)).toEqual({
      allowed: false,
      replayed: false,
      conflict: false,
      retryAfterMs: 2000,
      results: [
        { allowed: false, remaining: 3.5, retryAfterMs: 0, resetMs: 3000 },
        { allowed: false, remaining: 0, retryAfterMs: 2000, resetMs: 5000 },
      ],
    });
  });

  it('says never when one bucket can never take the cost', () => {
    const reply = parseReply([0, 0, 0, 0, -1, -1, 0, 0, 2000, 5000], 2);
    expect(decodeReply(reply).retryAfterMs).toBeNull();
  });

  it('refuses a malformed reply', () => {
    expect(() => parseReply([1, 0, 1], 1)).toThrow(TypeError);
    expect(() => parseReply('OK', 1)).toThrow(TypeError);
  });
});

describe('the fast validity check', () => {
  /** Mostly valid values, sometimes an edge or a wrong one: both sides of every bound get exercised. */
  const mostly = <T, U>(good: fc.Arbitrary<T>, bad: fc.Arbitrary<U>) =>
    fc.oneof({ weight: 60, arbitrary: good }, { weight: 1, arbitrary: bad });
  const number = (lo: number, hi: number) =>
    mostly(
      fc.oneof(fc.double({ min: lo, max: hi, noNaN: true }), fc.constantFrom(lo, hi)),
      fc.constantFrom(lo - 1e-9, hi * 1.0001 + 1, Number.NaN, Infinity, -Infinity, '1', null),
    );
  const integer = (lo: number, hi: number) =>
    mostly(
      fc.integer({ min: lo, max: hi }),
      fc.constantFrom(lo - 1, hi + 1, lo + 0.5, 2 ** 60, Number.NaN, '5'),
    );
  /** Rarely, an unknown key: strict objects must refuse it. */
  const maybeJunk = <T extends object>(a: fc.Arbitrary<T>) =>
    fc.tuple(a, fc.integer({ min: 0, max: 40 })).map(([v, roll]) => (roll === 0 ? { ...v, junk: 1 } : v));
  const check = maybeJunk(
    fc.record(
      {
        key: mostly(fc.string({ minLength: 1, maxLength: 512 }), fc.constantFrom('', 'x'.repeat(513), 5)),
        capacity: number(0, 1e9),
        refillPerSecond: number(0, 1e9),
        cost: number(1e-6, 1e9),
        ttlMs: integer(1, 30 * 24 * 3600 * 1000),
        floor: fc.option(
          maybeJunk(
            fc.record({
              beforeMicros: integer(0, Number.MAX_SAFE_INTEGER),
              refillPerSecond: number(0, 1e9),
              capacity: number(0, 1e9),
            }),
          ),
          { nil: undefined },
        ),
      },
      { requiredKeys: ['key', 'capacity', 'refillPerSecond', 'cost', 'ttlMs'] },
    ),
  );
  const request = maybeJunk(
    fc.record(
      {
        checks: mostly(
          fc.oneof(
            fc.array(check, { minLength: 1, maxLength: 2 }),
            fc.array(check, { minLength: 1, maxLength: 16 }),
          ),
          fc.array(check, { maxLength: 18 }),
        ),
        idempotency: maybeJunk(
          fc.record({
            key: mostly(fc.string({ minLength: 1, maxLength: 512 }), fc.constant('')),
            ttlMs: integer(1, 24 * 3600 * 1000),
          }),
        ),
        dryRun: mostly(fc.boolean(), fc.constantFrom('yes', 1, null)),
      },
      { requiredKeys: ['checks'] },
    ),
  );

  it('isTokenCost accepts exactly the costs TokenCost accepts', () => {
    const near = (x: number) => fc.constantFrom(x, x * (1 - Number.EPSILON), x * (1 + Number.EPSILON));
    fc.assert(
      fc.property(
        fc.oneof(
          fc.double(),
          fc.double({ min: 0, max: 2 * MAX_COST }),
          near(MIN_COST),
          near(MAX_COST),
          fc.constantFrom(0, -0, NaN, Infinity, -Infinity, '1', null, 1n),
          fc.anything(),
        ),
        (v) => {
          expect(isTokenCost(v)).toBe(TokenCost.safeParse(v).success);
        },
      ),
      { numRuns: 20_000 },
    );
  });

  it('accepts only what the zod schema accepts, and accepts most valid shapes', () => {
    let agreed = 0;
    let runs = 0;
    let accepted = 0;
    fc.assert(
      fc.property(
        fc.oneof({ weight: 9, arbitrary: request }, { weight: 1, arbitrary: fc.anything() }),
        (input) => {
          runs++;
          const fast = looksValid(input);
          const zod = DecideRequest.safeParse(input).success;
          if (fast) accepted++;
          if (fast) expect(zod).toBe(true);
          if (fast === zod) agreed++;
        },
      ),
      { numRuns: 5000 },
    );
    // The fast check may send a valid request to zod, but rarely: it must agree almost always.
    expect(agreed / runs).toBeGreaterThan(0.99);
    // …and the generator reaches both sides: a good share of the inputs are valid.
    expect(accepted / runs).toBeGreaterThan(0.1);
  });

  it('agrees with zod on every valid example of this file', () => {
    const one = { key: 'rl:v1:{s}:p', capacity: 10, refillPerSecond: 2, cost: 1, ttlMs: 60_000 };
    expect(looksValid({ checks: [one] })).toBe(true);
    expect(
      looksValid({
        checks: [{ ...one, floor: { beforeMicros: 5, refillPerSecond: 1, capacity: 3 } }],
        dryRun: true,
      }),
    ).toBe(true);
    expect(looksValid({ checks: [one], idempotency: { key: 'k', ttlMs: 1000 } })).toBe(true);
  });
});

describe('mergeRepeatedBuckets and spreadDecision', () => {
  const at = (key: string, cost: number) => ({ key, capacity: 4, refillPerSecond: 1, cost, ttlMs: 1000 });
  it('leaves a request without a repeated key as it is', () => {
    expect(mergeRepeatedBuckets([at('a', 1), at('b', 1)])).toBeUndefined();
    expect(mergeRepeatedBuckets([at('a', 1)])).toBeUndefined();
  });
  it('makes one check of summed cost per key, and spreads its result back to each check', () => {
    const merged = mergeRepeatedBuckets([at('s', 1), at('a', 2), at('s', 1.5), at('s', 1)])!;
    expect(merged.checks.map((c) => [c.key, c.cost])).toEqual([
      ['s', 3.5],
      ['a', 2],
    ]);
    expect(merged.of).toEqual([0, 1, 0, 0]);
    const decision = {
      allowed: false,
      replayed: false,
      conflict: false,
      retryAfterMs: 10,
      missing: [1],
      results: [
        { allowed: false, remaining: 3, retryAfterMs: 10, resetMs: 20 },
        { allowed: false, remaining: 0, retryAfterMs: 0, resetMs: 0 },
      ],
    };
    const spread = spreadDecision(decision, merged.of);
    expect(spread.results.map((r) => r.remaining)).toEqual([3, 0, 3, 3]);
    expect(spread.missing).toEqual([1]);
    expect(spread.results[0]).not.toBe(spread.results[2]);
  });
});
