import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  DecisionRequest,
  LayeredDecisionRequest,
  SingleDecisionRequest,
  checksOf,
  looksValidDecisionRequest,
} from '../../../../core/wire/agent.js';

const policy = fc.oneof(
  fc.constantFrom('writes', 'a', 'x'.repeat(64), 'x'.repeat(65), ''),
  fc.string({ maxLength: 3 }),
);
const subject = fc.oneof(
  fc.constantFrom('t1', 'user:42', '', 'x'.repeat(1024), 'x'.repeat(1025)),
  fc.string({ maxLength: 4 }),
);
const cost = fc.oneof(
  fc.constantFrom(undefined, 0, -1, 1, 0.5, 1e9, 1e9 + 1, Number.NaN, Infinity),
  fc.double(),
  fc.string({ maxLength: 2 }),
);
const key = fc.oneof(
  fc.constantFrom(undefined, 'k', 'with space', 'x'.repeat(256), 'x'.repeat(257), ''),
  fc.string({ maxLength: 3 }),
);
const flag = fc.oneof(fc.constantFrom(undefined, true, false), fc.anything({ maxDepth: 0 }));
const extra = fc.option(fc.constantFrom('extra', 'checks', 'policy'), { nil: undefined });

/** Absent and explicitly undefined fields must be judged alike: `drop` removes the undefined ones. */
function withOptional(o: Record<string, unknown>, drop: boolean): Record<string, unknown> {
  if (drop) for (const k of Object.keys(o)) if (o[k] === undefined) delete o[k];
  return o;
}

const check = fc
  .record({ policy, subject, cost, extra, drop: fc.boolean() })
  .map(({ policy, subject, cost, extra, drop }) =>
    withOptional({ policy, subject, cost, ...(extra ? { [extra]: 1 } : {}) }, drop),
  );
const single = fc
  .record({ policy, subject, cost, idempotencyKey: key, dryRun: flag, extra, drop: fc.boolean() })
  .map(({ extra, drop, ...o }) => withOptional({ ...o, ...(extra ? { [extra]: 'x' } : {}) }, drop));
const layered = fc
  .record({
    checks: fc.oneof(fc.array(check, { maxLength: 18 }), fc.anything({ maxDepth: 1 })),
    idempotencyKey: key,
    dryRun: flag,
    extra,
    drop: fc.boolean(),
  })
  .map(({ extra, drop, ...o }) =>
    withOptional({ ...o, ...(extra && extra !== 'checks' ? { [extra]: 'x' } : {}) }, drop),
  );

describe('looksValidDecisionRequest: the hot path check agrees with the zod schema', () => {
  it('accepts exactly what DecisionRequest accepts, for arbitrary bodies', () => {
    fc.assert(
      fc.property(fc.oneof(single, layered, fc.anything()), (body) => {
        expect(looksValidDecisionRequest(body)).toBe(DecisionRequest.safeParse(body).success);
      }),
      { numRuns: 5000 },
    );
  });

  it('pins the common cases', () => {
    expect(looksValidDecisionRequest({ policy: 'writes', subject: 't1' })).toBe(true);
    expect(looksValidDecisionRequest({ policy: 'writes', subject: 't1', cost: 0 })).toBe(false);
    expect(
      looksValidDecisionRequest({ checks: [{ policy: 'a', subject: 'b', cost: 2 }], dryRun: true }),
    ).toBe(true);
    expect(looksValidDecisionRequest({ checks: [] })).toBe(false);
    expect(looksValidDecisionRequest({ policy: 'a', subject: 'b', checks: [] })).toBe(false);
    expect(
      SingleDecisionRequest.safeParse({ policy: 'a', subject: 'b', idempotencyKey: 'a b' }).success,
    ).toBe(false);
    expect(
      LayeredDecisionRequest.safeParse({ checks: Array(17).fill({ policy: 'a', subject: 'b' }) }).success,
    ).toBe(false);
  });

  it('reads both forms as a list of checks', () => {
    expect(checksOf({ policy: 'a', subject: 'b' })).toEqual([{ policy: 'a', subject: 'b' }]);
    expect(checksOf({ policy: 'a', subject: 'b', cost: 3 })).toEqual([
      { policy: 'a', subject: 'b', cost: 3 },
    ]);
    expect(checksOf({ checks: [{ policy: 'a', subject: 'b' }] })).toEqual([{ policy: 'a', subject: 'b' }]);
  });
});
