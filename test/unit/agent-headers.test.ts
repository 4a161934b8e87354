import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { CheckResult } from '../../core/agent-wire.js';
import { rateLimitHeaders } from '../../regional-agent/http/rate-limit-headers.js';

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

describe('RateLimit headers (draft-ietf-httpapi-ratelimit-headers-10)', () => {
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
