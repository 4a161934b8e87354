/**
 * The layered runner on its own (regional-agent/decisions/layered-runner.ts), on the model store: one object per
 * check from request to answer, all-or-nothing across groups (a later denial refunds earlier groups), failure
 * modes first, idempotency conflicts, and a new subject moved to its policy's shared bucket.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { DecisionRequest } from '../../../../core/wire/agent.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { ANONYMOUS_SUBJECT } from '../../../../core/models/subject-creation.js';
import { AgentErrors } from '../../../../regional-agent/errors.js';
import { LayeredRunner } from '../../../../regional-agent/decisions/layered-runner.js';
import { decisionSteps, type DecisionSteps } from '../../../helpers/decision-steps.js';

const policies = [
  parsePolicy({ name: 'tenant', capacity: 10, refillPerSecond: 1, maxCost: 10 }),
  parsePolicy({ name: 'guesses', kind: 'sliding_log', capacity: 3, windowSeconds: 60, maxCost: 3 }),
  parsePolicy({
    name: 'signups',
    capacity: 5,
    refillPerSecond: 1,
    newSubjects: { perMinute: 1, flood: 'shared' },
  }),
];

let steps: DecisionSteps | undefined;
afterEach(() => steps?.close());

async function decide(s: DecisionSteps, request: DecisionRequest) {
  const prepared = s.prepare(request);
  const outcome = await new LayeredRunner(s.deps).run(prepared, s.clock.now() + 1000);
  return { prepared, outcome };
}

describe('LayeredRunner', () => {
  it('answers one object per check, in request order, with its result, fit, window and charge', async () => {
    const s = (steps = decisionSteps(policies));
    const { outcome } = await decide(s, {
      checks: [
        { policy: 'guesses', subject: 'acme', cost: 2 },
        { policy: 'tenant', subject: 'acme', cost: 4 },
      ],
    });
    expect(outcome).toMatchObject({ allowed: true, retryAfterMs: 0, replayed: false, unavailable: false });
    expect(
      outcome.checks.map((c) => [c.at, c.prepared.policy.name, c.result?.remaining, c.fits, c.window]),
    ).toEqual([
      [0, 'guesses', 1, true, 60],
      [1, 'tenant', 6, true, 10],
    ]);
    expect(outcome.results).toEqual(outcome.checks.map((c) => c.result));
    expect(outcome.checks.map((c) => c.charge?.kind)).toEqual(['log', 'bucket']);
    expect(outcome.checks[1]?.charge).toEqual({
      kind: 'bucket',
      policy: 'tenant',
      key: bucketKey(1, 'acme', 'tenant'),
      capacity: 10,
      cost: 4,
    });
  });

  it('a later group that denies: the earlier group is refunded and its check reports its bucket as it is again', async () => {
    const s = (steps = decisionSteps(policies));
    await decide(s, { policy: 'guesses', subject: 'acme', cost: 3 });
    // The token bucket's group runs first and charges 4; the log, full, denies; the 4 come back.
    const { outcome } = await decide(s, {
      checks: [
        { policy: 'tenant', subject: 'acme', cost: 4 },
        { policy: 'guesses', subject: 'acme', cost: 1 },
      ],
    });
    expect(outcome.allowed).toBe(false);
    const [tenant, guesses] = outcome.checks;
    expect([tenant?.result?.allowed, tenant?.fits, tenant?.result?.remaining]).toEqual([false, true, 10]);
    expect([guesses?.result?.allowed, guesses?.fits, guesses?.result?.reason]).toEqual([
      false,
      false,
      'subject_exhausted',
    ]);
    expect(outcome.retryAfterMs).toBe(guesses?.result?.retryAfterMs);
    const after = await decide(s, { policy: 'tenant', subject: 'acme', cost: 10, dryRun: true });
    expect(after.outcome.allowed).toBe(true);
  });

  it('a check with no lease takes its failure mode first; the others are only looked at', async () => {
    const s = (steps = decisionSteps(policies, { noLease: true, shares: { tenant: 1 } }));
    const { outcome } = await decide(s, {
      checks: [
        { policy: 'tenant', subject: 'acme', cost: 4 },
        { policy: 'guesses', subject: 'acme', cost: 1 },
      ],
    });
    expect(outcome).toMatchObject({ allowed: false, unavailable: true, retryAfterMs: 1000 });
    expect(outcome.checks.map((c) => [c.prepared.route, c.result?.reason, c.fits, c.charge])).toEqual([
      ['store', undefined, true, undefined],
      ['fail', 'no_lease', false, undefined],
    ]);
    // Looked at, not charged: a look reports what the bucket holds.
    expect(outcome.checks[0]?.result?.remaining).toBe(10);
  });

  it('one idempotency key on two different layered requests: the second is a conflict and charges nothing', async () => {
    const s = (steps = decisionSteps(policies));
    const layered = (cost: number): DecisionRequest => ({
      idempotencyKey: 'k1',
      checks: [
        { policy: 'tenant', subject: 'acme', cost },
        { policy: 'guesses', subject: 'acme', cost: 1 },
      ],
    });
    await decide(s, layered(2));
    await expect(decide(s, layered(3))).rejects.toBeInstanceOf(AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT);
    const retry = await decide(s, layered(2));
    expect(retry.outcome.replayed).toBe(true);
    expect(retry.outcome.checks.map((c) => c.result?.remaining)).toEqual([8, 2]);
  });

  it('a new subject past the creation cap (flood: shared) is moved to the shared bucket; the request is not changed', async () => {
    const s = (steps = decisionSteps(policies));
    await decide(s, { policy: 'signups', subject: 'first' });
    const { prepared, outcome } = await decide(s, { policy: 'signups', subject: 'second' });
    expect(outcome.allowed).toBe(true);
    const [check] = outcome.checks;
    expect([check?.prepared.subject, check?.result?.reason, check?.result?.remaining]).toEqual([
      ANONYMOUS_SUBJECT,
      'shared_bucket',
      4,
    ]);
    expect(check?.charge).toMatchObject({ key: bucketKey(1, ANONYMOUS_SUBJECT, 'signups'), cost: 1 });
    expect(prepared.checks[0]?.subject).toBe('second');
  });
});
