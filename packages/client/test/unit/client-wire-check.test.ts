/**
 * The client's fast checks of decision and batch answers (packages/client/src/wire-check.ts) accept only what
 * zod's DecisionResponse and BatchResponse accept: every mutation of a valid answer they accept, zod accepts too.
 */
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { BatchResponse } from '../../../../core/wire/batch.js';
import { fastAnswers, fastDecision } from '../../src/wire-check.js';

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

const problem = (status: number, code: string) => ({
  type: 'about:blank',
  title: 'T',
  status,
  code,
  detail: 'd',
});
const validBatch = () => ({
  answers: [
    { status: 200, body: valid() },
    { status: 503, retryAfter: 10, body: problem(503, 'AGT_ERR_OVERLOADED') },
    { status: 404, body: problem(404, 'AGT_ERR_UNKNOWN_POLICY') },
  ],
});

type BatchMutation = [string, (b: ReturnType<typeof validBatch>) => unknown];
const at = (path: (string | number)[], value: unknown): BatchMutation => [
  `${path.join('.')} = ${JSON.stringify(value)}`,
  (b) => set(path, value)[1](b as unknown as ReturnType<typeof valid>),
];

const batchMutations: BatchMutation[] = [
  at(['answers', 1, 'retryAfter'], undefined),
  at(['answers', 1, 'retryAfter'], 1),
  at(['answers', 1, 'retryAfter'], 0),
  at(['answers', 1, 'retryAfter'], -1),
  at(['answers', 1, 'retryAfter'], 1.5),
  at(['answers', 1, 'retryAfter'], '10'),
  at(['answers', 1, 'retryAfter'], null),
  at(['answers', 2, 'retryAfter'], 3),
  at(['answers', 2, 'retryAfter'], 'soon'),
  at(['answers', 1, 'status'], 399),
  at(['answers', 1, 'status'], 600),
  at(['answers', 1, 'status'], 503.5),
  at(['answers', 1, 'status'], '503'),
  at(['answers', 1, 'body'], undefined),
  at(['answers', 1, 'body', 'code'], 7),
  at(['answers', 0, 'body', 'allowed'], 'yes'),
  at(['answers', 0, 'status'], 201),
  at(['answers', 1], null),
  at(['answers', 1], []),
  at(['answers'], {}),
  ['not an object', () => 'answers'],
];

describe('fastAnswers', () => {
  const zodAccepts = (b: unknown) => {
    const parsed = BatchResponse.safeParse(b);
    return parsed.success && parsed.data.answers.length === 3;
  };

  it('accepts a valid batch answer as it is, shed elements with their retryAfter', () => {
    const b = validBatch();
    expect(fastAnswers(b, 3)).toBe(b.answers);
    expect(zodAccepts(b)).toBe(true);
    expect(BatchResponse.parse(b).answers[1]).toMatchObject({ retryAfter: 10 });
    expect(fastAnswers(b, 2)).toBeUndefined();
  });

  it.each(batchMutations)('%s: accepted only if zod accepts it', (_name, mutate) => {
    const b = mutate(validBatch());
    if (fastAnswers(b, 3) !== undefined) expect(zodAccepts(b)).toBe(true);
  });

  it('agrees with zod on every mutation', () => {
    const verdicts = batchMutations.map(([name, mutate]) => {
      const b = mutate(validBatch());
      return [name, fastAnswers(b, 3) !== undefined, zodAccepts(b)] as const;
    });
    expect(verdicts.filter(([, fast, zod]) => fast !== zod).map(([name]) => name)).toEqual([]);
    // Both refuse a retryAfter that is not whole seconds, at least one.
    expect(verdicts.filter(([, fast]) => !fast).map(([name]) => name)).toEqual(
      expect.arrayContaining([
        'answers.1.retryAfter = 0',
        'answers.1.retryAfter = 1.5',
        'answers.1.retryAfter = "10"',
        'answers.2.retryAfter = "soon"',
      ]),
    );
  });
});
