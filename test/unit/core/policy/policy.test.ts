import { describe, expect, it } from 'vitest';
import { Policy, PolicySpec, defaultIdleTtl, parsePolicy } from '../../../../core/policy/policy.js';

const base = { name: 'writes', capacity: 10, refillPerSecond: 2 };

function issues(input: unknown): string[] {
  const r = Policy.safeParse(input);
  return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
}

describe('policy schema', () => {
  it('fills every default', () => {
    expect(parsePolicy(base)).toEqual({
      kind: 'token_bucket',
      name: 'writes',
      capacity: 10,
      refillPerSecond: 2,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 60,
      version: 1,
    });
  });

  it('defaults the idle TTL to the time to refill from empty when that exceeds a minute', () => {
    expect(parsePolicy({ ...base, capacity: 100, refillPerSecond: 100 / 3600 }).idleTtlSeconds).toBe(3600);
    expect(defaultIdleTtl(5, 0.001)).toBe(5000);
  });

  it('refuses a TTL shorter than the time to refill from empty', () => {
    expect(issues({ ...base, idleTtlSeconds: 4 })).toEqual([
      'idleTtlSeconds: idleTtlSeconds must be ≥ capacity / refillPerSecond = 5 s, so an expired bucket is never fuller than a full one',
    ]);
    expect(issues({ ...base, idleTtlSeconds: 5 })).toEqual([]);
  });

  it.each([
    [{ capacity: 0 }, 'capacity: capacity must be > 0'],
    [{ capacity: -1 }, 'capacity: capacity must be > 0'],
    [{ capacity: 2e9 }, 'capacity: capacity must be ≤ 1000000000'],
    [{ refillPerSecond: 0 }, 'refillPerSecond: refillPerSecond must be > 0'],
    [{ maxCost: 11 }, 'maxCost: maxCost must be ≤ capacity'],
    [{ mode: 'strict' }, 'homeRegion: strict policies need a homeRegion'],
    [
      { mode: 'strict', homeRegion: 'us', onStoreFailure: 'open' },
      'onStoreFailure: strict policies guard high-value operations and may not fail open',
    ],
    [
      { minShare: 0.05, maxCost: 1 },
      'minShare: minShare × capacity must be ≥ maxCost (1) so a region holding a share can admit the largest cost',
    ],
    [{ version: 0 }, 'version: Too small: expected number to be >0'],
    [{ name: 'Bad Name' }, 'name: policy names are 1-64 chars of a-z 0-9 _ - . starting with a-z or 0-9'],
    [{ name: 'x'.repeat(65) }, 'name: policy names are 1-64 chars of a-z 0-9 _ - . starting with a-z or 0-9'],
    [{ homeRegion: 'US' }, 'homeRegion: region names are 1-32 chars of a-z 0-9 - starting with a-z'],
    [{ extra: 1 }, ': Unrecognized key: "extra"'],
  ])('refuses %j', (patch, message) => {
    expect(issues({ ...base, ...patch })).toContain(message);
  });

  // Each kind's rate rules, their messages named from its traits (core/kinds/<kind>/traits.ts `called`, `units`,
  // `noun`): the text each kind answered before the messages were read from traits.
  const log = { name: 'log', kind: 'sliding_log', capacity: 10, windowSeconds: 60 };
  const slots = { name: 'slots', kind: 'concurrency', capacity: 10, leaseSeconds: 60 };
  const day = { name: 'day', kind: 'daily', capacity: 10 };
  it.each([
    [{ name: 'tb', capacity: 10 }, 'refillPerSecond: token-bucket policies need refillPerSecond'],
    [{ ...log, windowSeconds: undefined }, 'windowSeconds: sliding_log policies need windowSeconds'],
    [{ ...slots, leaseSeconds: undefined }, 'leaseSeconds: concurrency policies need leaseSeconds'],
    [
      { ...log, capacity: 10.5 },
      'capacity: a sliding log counts whole events: capacity must be an integer ≤ 100000',
    ],
    [
      { ...log, capacity: 100_001 },
      'capacity: a sliding log counts whole events: capacity must be an integer ≤ 100000',
    ],
    [{ ...log, maxCost: 1.5 }, 'maxCost: a sliding log counts whole events: maxCost must be an integer'],
    [
      { ...slots, capacity: 10.5 },
      'capacity: a concurrency policy counts whole slots: capacity must be an integer ≤ 100000',
    ],
    [
      { ...slots, maxCost: 1.5 },
      'maxCost: a concurrency policy counts whole slots: maxCost must be an integer',
    ],
    [
      { ...slots, mode: 'strict', homeRegion: 'us' },
      'mode: concurrency policies are regional or local: a lease is released in the region that holds it',
    ],
    [
      { ...log, onStoreFailure: 'local' },
      'onStoreFailure: an emergency token bucket is not an exact rolling window: use closed or open',
    ],
    [
      { ...slots, onStoreFailure: 'local' },
      'onStoreFailure: an emergency token bucket is not a slot count: use closed or open',
    ],
    [
      { ...day, onStoreFailure: 'local' },
      'onStoreFailure: an emergency token bucket is not a calendar-day budget: use closed or open',
    ],
    [
      { ...log, refillPerSecond: 1 },
      "refillPerSecond: a sliding_log policy's rate is capacity / windowSeconds = 0.167; omit refillPerSecond",
    ],
  ])('refuses %j, naming the kind from its traits', (input, message) => {
    expect(issues(input)).toContain(message);
  });

  it('takes fractional amounts of a kind that does not count whole units', () => {
    expect(issues({ ...day, capacity: 10.5, maxCost: 1.5 })).toEqual([]);
    expect(issues({ ...base, capacity: 10.5, maxCost: 1.5 })).toEqual([]);
  });

  it('lists every problem at once', () => {
    expect(issues({ name: 'ok', capacity: -1, refillPerSecond: -1 })).toHaveLength(2);
  });

  it('parses the operator body without a name', () => {
    expect(PolicySpec.parse({ capacity: 120, refillPerSecond: 2, maxCost: 10 })).toMatchObject({
      maxCost: 10,
      version: 1,
    });
  });
});
