/**
 * The client's fast check of decision answers (packages/client/src/wire-check.ts) accepts only what zod's
 * DecisionResponse accepts: every mutation of a valid answer it accepts, zod accepts too.
 */
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { fastDecision } from '../../src/wire-check.js';

const valid = () => ({
  allowed: false,
  retryAfterMs: 600,
  results: [
    {
      policy: 'p',
      allowed: false,
      remaining: 0,
      limit: 100,
      resetMs: 60_000,
      retryAfterMs: 600,
      mode: 'regional',
      reason: 'subject_exhausted',
    },
  ],
  headers: { 'RateLimit-Policy': '"p";q=100;w=60', 'Retry-After': '1' },
});

type Mutation = [string, (d: ReturnType<typeof valid>) => unknown];
const set = (path: (string | number)[], value: unknown): Mutation => [
  `${path.join('.')} = ${JSON.stringify(value)}`,
  (d) => {
    let at: Record<string | number, unknown> = d;
    for (const k of path.slice(0, -1)) at = at[k] as Record<string | number, unknown>;
    const last = path[path.length - 1]!;
    if (value === undefined) delete at[last];
    else at[last] = value;
    return d;
  },
];

const mutations: Mutation[] = [
  set(['allowed'], 'yes'),
  set(['allowed'], undefined),
  set(['retryAfterMs'], -1),
  set(['retryAfterMs'], null),
  set(['retryAfterMs'], '600'),
  set(['replayed'], 1),
  set(['replayed'], true),
  set(['results'], {}),
  set(['results'], []),
  set(['results', 0], null),
  set(['results', 0, 'policy'], 7),
  set(['results', 0, 'remaining'], 1.5),
  set(['results', 0, 'remaining'], -1),
  set(['results', 0, 'limit'], undefined),
  set(['results', 0, 'resetMs'], null),
  set(['results', 0, 'resetMs'], -5),
  set(['results', 0, 'retryAfterMs'], null),
  set(['results', 0, 'mode'], 'global'),
  set(['results', 0, 'mode'], undefined),
  set(['results', 0, 'reason'], 'tired'),
  set(['results', 0, 'reason'], undefined),
  set(['results', 0, 'cause'], 'no_lease'),
  set(['results', 0, 'cause'], 'none'),
  set(['results', 0, 'lease'], 42),
  set(['results', 0, 'lease'], 'tok'),
  set(['headers'], []),
  set(['headers'], null),
  set(['headers', 'Retry-After'], 1),
  ['a __proto__ header', (d) => ({ ...d, headers: JSON.parse('{"__proto__":"x","a":"b"}') as unknown })],
  ['not an object', () => 'decision'],
];

describe('fastDecision', () => {
  it('accepts a valid answer as it is', () => {
    const d = valid();
    expect(fastDecision(d)).toBe(d);
    expect(DecisionResponse.safeParse(d).success).toBe(true);
  });

  it.each(mutations)('%s: accepted only if zod accepts it', (_name, mutate) => {
    const d = mutate(valid());
    const zod = DecisionResponse.safeParse(d).success;
    if (fastDecision(d) !== undefined) expect(zod).toBe(true);
  });

  it('leaves exactly the invalid mutations to zod and zod refuses them', () => {
    const verdicts = mutations.map(([name, mutate]) => {
      const d = mutate(valid());
      return [name, fastDecision(d) !== undefined, DecisionResponse.safeParse(d).success] as const;
    });
    // The fast check refuses the __proto__ header (zod accepts it by dropping the key); otherwise they agree.
    expect(verdicts.filter(([, fast, zod]) => fast !== zod).map(([name]) => name)).toEqual([
      'a __proto__ header',
    ]);
  });
});
