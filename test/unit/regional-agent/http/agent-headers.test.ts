import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { CheckResult } from '../../../../core/wire/agent.js';
import { parsePolicy, type Policy } from '../../../../core/policy/policy.js';
import { loadConfig } from '../../../../regional-agent/config.js';
import {
  advertisedQuota,
  DEFAULT_RATE_LIMIT_DRAFT,
  RATE_LIMIT_DRAFTS,
  rateLimitHeaders,
  type HeaderInput,
} from '../../../../core/wire/rate-limit-headers.js';
import { newCheck, type Check } from '../../../../regional-agent/decisions/check.js';
import { summarize } from '../../../../regional-agent/decisions/outcome.js';
import type { PreparedCheck } from '../../../../regional-agent/decisions/prepared.js';
import type { ShortfallHandler } from '../../../../regional-agent/decisions/borrowing-port.js';

const result = (over: Partial<CheckResult> = {}): CheckResult => ({
  policy: 'writes',
  allowed: true,
  remaining: 7.6,
  limit: 10,
  resetMs: 2400,
  retryAfterMs: 0,
  mode: 'regional',
  ...over,
});

describe('RateLimit headers, QP_RATE_LIMIT_HEADERS=draft-10', () => {
  it('allowed: every policy, remaining floored, t = seconds until full, no Retry-After', () => {
    const h = rateLimitHeaders(
      true,
      [
        { result: result(), windowSeconds: 10, violated: false },
        {
          result: result({ policy: 'reads', remaining: 99, limit: 100, resetMs: 100 }),
          windowSeconds: 10,
          violated: false,
        },
      ],
      false,
      'draft-10',
    );
    expect(h).toEqual({
      'RateLimit-Policy': '"writes";q=10;w=10, "reads";q=100;w=10',
      RateLimit: '"writes";r=7;t=3, "reads";r=99;t=1',
    });
  });

  it('denied: only violated policies, t = seconds until the cost fits, Retry-After = the largest t', () => {
    const h = rateLimitHeaders(
      false,
      [
        {
          result: result({ allowed: false, retryAfterMs: 1200, remaining: 0.3 }),
          windowSeconds: 10,
          violated: true,
        },
        {
          result: result({ policy: 'reads', allowed: false, limit: 100 }),
          windowSeconds: 10,
          violated: false,
        },
        {
          result: result({ policy: 'burst', allowed: false, retryAfterMs: 3001, remaining: 0 }),
          windowSeconds: 5,
          violated: true,
        },
      ],
      true,
      'draft-10',
    );
    expect(h).toEqual({
      'RateLimit-Policy': '"writes";q=10;w=10, "reads";q=100;w=10, "burst";q=10;w=5',
      RateLimit: '"writes";r=0;t=2, "burst";r=0;t=4',
      'Retry-After': '4',
      'X-RateLimit-Limit': '10',
      'X-RateLimit-Remaining': '0',
      'X-RateLimit-Reset': '4',
    });
  });

  it('a cost that can never fit has no t and no Retry-After', () => {
    const h = rateLimitHeaders(
      false,
      [
        {
          result: result({ allowed: false, retryAfterMs: null, reason: 'cost_exceeds_share' }),
          windowSeconds: 10,
          violated: true,
        },
      ],
      false,
      'draft-10',
    );
    expect(h).toEqual({ 'RateLimit-Policy': '"writes";q=10;w=10', RateLimit: '"writes";r=7' });
  });

  it('Retry-After is never earlier than any t listed and never earlier than retryAfterMs', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 10_000_000 }), { minLength: 1, maxLength: 6 }),
        (waits) => {
          const h = rateLimitHeaders(
            false,
            waits.map((w, i) => ({
              result: result({ policy: `p${i}`, allowed: false, retryAfterMs: w, remaining: -3 }),
              windowSeconds: 1,
              violated: true,
            })),
            false,
            'draft-10',
          );
          const ts = [...h['RateLimit']!.matchAll(/;t=(\d+)/g)].map((m) => Number(m[1]));
          const retryAfter = Number(h['Retry-After']);
          expect(Number.isInteger(retryAfter)).toBe(true);
          for (const t of ts) expect(retryAfter).toBeGreaterThanOrEqual(t);
          expect(retryAfter * 1000).toBeGreaterThanOrEqual(Math.max(...waits));
          expect(h['RateLimit']).not.toMatch(/r=-/);
        },
      ),
    );
  });
});

describe('RateLimit headers, QP_RATE_LIMIT_HEADERS=draft-11 (the default)', () => {
  it("the draft's own example: RateLimit-Policy q=100;w=10 and RateLimit r=50;t=30", () => {
    const h = rateLimitHeaders(
      true,
      [
        {
          result: result({ policy: 'default', remaining: 50, limit: 100, resetMs: 30_000 }),
          windowSeconds: 10,
          violated: false,
        },
      ],
      false,
    );
    expect(h).toEqual({
      'RateLimit-Policy': '"default";q=100;w=10',
      RateLimit: '"default";r=50;t=30',
    });
  });

  it('denied: every policy listed with r available and t until restored; Retry-After until the cost fits', () => {
    const h = rateLimitHeaders(
      false,
      [
        {
          result: result({ allowed: false, retryAfterMs: 1200, remaining: 0.3, resetMs: 9700 }),
          windowSeconds: 10,
          violated: true,
        },
        {
          result: result({ policy: 'reads', allowed: false, limit: 100, remaining: 99, resetMs: 100 }),
          windowSeconds: 10,
          violated: false,
        },
      ],
      true,
    );
    expect(h).toEqual({
      'RateLimit-Policy': '"writes";q=10;w=10, "reads";q=100;w=10',
      RateLimit: '"writes";r=0;t=10, "reads";r=99;t=1',
      'Retry-After': '2',
      'X-RateLimit-Limit': '10',
      'X-RateLimit-Remaining': '0',
      'X-RateLimit-Reset': '10',
    });
  });

  it('a cost that can never fit keeps its t and sends no Retry-After', () => {
    const h = rateLimitHeaders(
      false,
      [{ result: result({ allowed: false, retryAfterMs: null }), windowSeconds: 10, violated: true }],
      false,
    );
    expect(h).toEqual({ 'RateLimit-Policy': '"writes";q=10;w=10', RateLimit: '"writes";r=7;t=3' });
  });

  it('Retry-After is never earlier than any violated wait; every number is a non-negative integer', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            wait: fc.integer({ min: 1, max: 10_000_000 }),
            remaining: fc.double({ min: -5, max: 200, noNaN: true }),
            reset: fc.integer({ min: 0, max: 10_000_000 }),
            violated: fc.boolean(),
          }),
          { minLength: 1, maxLength: 6 },
        ),
        (checks) => {
          const h = rateLimitHeaders(
            false,
            checks.map((c, i) => ({
              result: result({
                policy: `p${i}`,
                allowed: false,
                retryAfterMs: c.wait,
                remaining: c.remaining,
                limit: 100.7,
                resetMs: c.reset,
              }),
              windowSeconds: 1,
              violated: c.violated || i === 0,
            })),
            true,
          );
          const numbers = [
            ...Object.values(h)
              .join(' ')
              .matchAll(/[=\s]([-\d.e]+)/g),
          ].map((m) => m[1]!);
          for (const n of numbers) expect(n).toMatch(/^\d+$/);
          const waits = checks.filter((c, i) => c.violated || i === 0).map((c) => c.wait);
          expect(Number(h['Retry-After']) * 1000).toBeGreaterThanOrEqual(Math.max(...waits));
        },
      ),
    );
  });
});

describe('truthful numbers for a check that borrows', () => {
  // The issue's `reports`: capacity 5, refill 0.1/s (w=50); this region holds a third, 1.67 tokens.
  const reports = (over: Partial<CheckResult> = {}, budget = { borrowable: true }): HeaderInput => ({
    result: result({ policy: 'reports', limit: 5 / 3, remaining: 0, resetMs: 50_000, ...over }),
    windowSeconds: 50,
    violated: false,
    budget: { capacity: 5, refillPerSecond: 0.1, ...budget },
  });

  it('q is the global capacity; r is never 0 while borrowing could fetch a token; t from the policy refill', () => {
    expect(advertisedQuota(reports())).toEqual({ q: 5, r: 1, restoreSeconds: 40 });
    expect(advertisedQuota(reports({ remaining: 0.67 }))).toEqual({ q: 5, r: 1, restoreSeconds: 40 });
    expect(advertisedQuota(reports({ remaining: 1.6 }))).toEqual({ q: 5, r: 1, restoreSeconds: 40 });
    // Nobody left to borrow from: r says what this region holds.
    expect(advertisedQuota(reports({}, { borrowable: false }))).toEqual({ q: 5, r: 0, restoreSeconds: 50 });
    // A refused check says what it holds, whatever borrowing might do later.
    expect(advertisedQuota({ ...reports(), violated: true })).toEqual({ q: 5, r: 0, restoreSeconds: 50 });
  });

  it('t does not follow the local reset: 30 → 40 → 30 → 50 of the region bucket reads as one t', () => {
    const ts = [30_000, 40_000, 30_000, 50_000].map(
      (resetMs) => rateLimitHeaders(true, [reports({ resetMs, remaining: 0.4 })], false)['RateLimit'],
    );
    expect(new Set(ts)).toEqual(new Set(['"reports";r=1;t=40']));
  });

  it('legacy X-RateLimit-* carry the same q, r and t', () => {
    const h = rateLimitHeaders(true, [reports({ remaining: 0.2 })], true);
    expect(h).toEqual({
      'RateLimit-Policy': '"reports";q=5;w=50',
      RateLimit: '"reports";r=1;t=40',
      'X-RateLimit-Limit': '5',
      'X-RateLimit-Remaining': '1',
      'X-RateLimit-Reset': '40',
    });
  });

  it('r never exceeds q and t never exceeds the window', () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0, max: 1000, noNaN: true }),
        fc.double({ min: 1, max: 1000, noNaN: true }),
        fc.double({ min: 0.001, max: 1000, noNaN: true }),
        fc.boolean(),
        (remaining, capacity, refill, borrowable) => {
          const a = advertisedQuota({
            result: result({ remaining: Math.min(remaining, capacity) }),
            windowSeconds: Math.ceil(capacity / refill),
            violated: false,
            budget: { capacity, refillPerSecond: refill, borrowable },
          });
          expect(Number.isInteger(a.r) && Number.isInteger(a.q)).toBe(true);
          expect(a.r).toBeLessThanOrEqual(a.q);
          expect(a.restoreSeconds).toBeLessThanOrEqual(Math.ceil(capacity / refill));
        },
      ),
    );
  });
});

describe('which checks describe the global budget (summarize)', () => {
  const reports = parsePolicy({ name: 'reports', capacity: 5, refillPerSecond: 0.1 });
  /** A check of `policy` on `route`, decided with a result that fit. */
  const decided = (policy: Policy, route = 'store', over: Partial<CheckResult> = {}): Check => {
    const c = newCheck(
      { route, policy, subject: 'tenant-1', cost: 1, bucket: {} } as unknown as PreparedCheck,
      0,
    );
    c.result = result({ policy: 'reports', limit: 5 / 3, remaining: 0.67, ...over });
    return c;
  };
  const budgets = (checks: Check[], handler?: ShortfallHandler) =>
    summarize(checks, true, false, handler).checks.map((c) => c.budget);
  let asked = 0;
  const handler = (lends: boolean): ShortfallHandler => ({
    cover: () => Promise.resolve({ covered: false, reasons: [] }),
    mayLend: () => (asked++, lends),
  });

  it('a regional token bucket with borrowing on: q and refill of the policy, borrowable as the borrower says', () => {
    asked = 0;
    expect(budgets([decided(reports)], handler(true))).toEqual([
      { capacity: 5, refillPerSecond: 0.1, borrowable: true },
    ]);
    expect(budgets([decided(reports)], handler(false))).toEqual([
      { capacity: 5, refillPerSecond: 0.1, borrowable: false },
    ]);
    // A bucket holding a whole token is not asked about borrowing (the hot path stays as it was).
    budgets([decided(reports, 'store', { remaining: 1.2 })], handler(true));
    expect(asked).toBe(2);
  });

  it("the region's own numbers elsewhere: no borrowing, a failure mode, the shared bucket, a sharded or strict policy", () => {
    expect(budgets([decided(reports)])).toEqual([undefined]);
    for (const reason of ['emergency_bucket', 'fail_open', 'shared_bucket'] as const)
      expect(budgets([decided(reports, 'store', { reason })], handler(true))).toEqual([undefined]);
    const sharded = parsePolicy({ name: 'reports', capacity: 40, refillPerSecond: 1, shards: 4 });
    const strict = parsePolicy({
      name: 'reports',
      capacity: 5,
      refillPerSecond: 0.1,
      mode: 'strict',
      homeRegion: 'eu',
    });
    for (const c of [decided(sharded), decided(strict), decided(reports, 'forward')])
      expect(budgets([c], handler(true))).toEqual([undefined]);
  });

  it('each check is given its window: seconds to refill its policy from empty', () => {
    expect(summarize([decided(reports)], true, false).checks.map((c) => c.window)).toEqual([50]);
  });
});

describe('QP_RATE_LIMIT_HEADERS', () => {
  it('defaults to draft-11, accepts draft-10, refuses anything else', () => {
    const base = { QP_REGION: 'us', QP_REDIS_URL: 'redis://127.0.0.1:6379', QP_POLICIES_FILE: 'p.json' };
    expect(loadConfig(base).rateLimitHeaders).toBe('draft-11');
    expect(loadConfig({ ...base, QP_RATE_LIMIT_HEADERS: 'draft-10' }).rateLimitHeaders).toBe('draft-10');
    expect(() => loadConfig({ ...base, QP_RATE_LIMIT_HEADERS: 'draft-9' })).toThrow(/QP_RATE_LIMIT_HEADERS/);
  });

  it('docs/agent.md has its row, with the default of the schema', () => {
    const doc = readFileSync(new URL('../../../../docs/agent.md', import.meta.url), 'utf8');
    const row = doc.split('\n').find((l) => l.startsWith('| `QP_RATE_LIMIT_HEADERS`'));
    expect(row).toBeDefined();
    const cells = row!.split('|').map((c) => c.trim());
    expect(cells[2]).toBe(`\`${DEFAULT_RATE_LIMIT_DRAFT}\``);
    for (const d of RATE_LIMIT_DRAFTS) expect(row).toContain(`\`${d}\``);
  });
});
