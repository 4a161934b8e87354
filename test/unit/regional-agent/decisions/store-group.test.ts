/**
 * The token-bucket store group on its own (regional-agent/decisions/store-group.ts), on the model store: one
 * slot's checks decided all-or-nothing, each check's result, fit and charge written into it, looks, store
 * failures, idempotent replays, and refusals put to the borrowing port.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { DecisionRequest } from '../../../../core/wire/agent.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { ShortCheck, ShortfallHandler } from '../../../../regional-agent/decisions/borrowing-port.js';
import { newCheck, type Check } from '../../../../regional-agent/decisions/check.js';
import { groupChecks, type StoreGroup } from '../../../../regional-agent/decisions/check-groups.js';
import type { DecisionStore } from '../../../../regional-agent/decisions/decision-store.js';
import { runStoreGroup, type StoreGroupCall } from '../../../../regional-agent/decisions/store-group.js';
import { decisionSteps, type DecisionSteps } from '../../../helpers/decision-steps.js';

const policies = [
  parsePolicy({ name: 'tenant', capacity: 10, refillPerSecond: 1, maxCost: 10 }),
  parsePolicy({ name: 'user', capacity: 5, refillPerSecond: 1, maxCost: 5 }),
  parsePolicy({ name: 'open', capacity: 5, refillPerSecond: 1, onStoreFailure: 'open' }),
];

let steps: DecisionSteps | undefined;
afterEach(() => steps?.close());

/** The one store group of `request`, its checks, and a call of it. */
function group(s: DecisionSteps, request: DecisionRequest, over: Partial<StoreGroupCall> = {}) {
  const prepared = s.prepare(request);
  const checks: Check[] = prepared.checks.map((p, at) => newCheck(p, at));
  const [g] = groupChecks(checks, (key) => s.store.slotOf(key));
  expect(g?.kind).toBe('store');
  const call: StoreGroupCall = {
    group: g as StoreGroup,
    idempotencyKey: undefined,
    dryRun: false,
    lookOnly: false,
    deadlineAt: s.clock.now() + 1000,
    ...over,
  };
  return { checks, call };
}

/** Tokens (policy, subject)'s bucket holds now, by a look (a missing bucket is a full one). */
async function held(s: DecisionSteps, policy: string, subject: string): Promise<number | undefined> {
  const { checks, call } = group(s, { policy, subject }, { lookOnly: true });
  await runStoreGroup(s.deps, call);
  return checks[0]?.result?.remaining;
}

describe('runStoreGroup', () => {
  it("admits a slot's checks together: each check holds its result, its fit and what it charged", async () => {
    const s = (steps = decisionSteps(policies));
    const { checks, call } = group(s, {
      checks: [
        { policy: 'tenant', subject: 'acme', cost: 3 },
        { policy: 'user', subject: 'acme', cost: 3 },
      ],
    });
    const run = await runStoreGroup(s.deps, call);
    expect(run).toMatchObject({ allowed: true, charged: true, fresh: true, replayed: false });
    expect(checks.map((c) => [c.result?.allowed, c.result?.remaining, c.result?.limit, c.fits])).toEqual([
      [true, 7, 10, true],
      [true, 2, 5, true],
    ]);
    expect(checks.map((c) => c.charge)).toEqual([
      { kind: 'bucket', policy: 'tenant', key: bucketKey(1, 'acme', 'tenant'), capacity: 10, cost: 3 },
      { kind: 'bucket', policy: 'user', key: bucketKey(1, 'acme', 'user'), capacity: 5, cost: 3 },
    ]);
  });

  it('refuses all or nothing: the check that did not fit says why, the other is not charged', async () => {
    const s = (steps = decisionSteps(policies));
    await runStoreGroup(s.deps, group(s, { policy: 'user', subject: 'acme', cost: 4 }).call);
    const { checks, call } = group(s, {
      checks: [
        { policy: 'tenant', subject: 'acme', cost: 3 },
        { policy: 'user', subject: 'acme', cost: 3 },
      ],
    });
    const run = await runStoreGroup(s.deps, call);
    expect(run).toMatchObject({ allowed: false, charged: false });
    const [tenant, user] = checks;
    // 3 tokens fit the tenant's 10, which was not charged; the user's bucket holds 1: 2 more come in 2 s. The
    // whole budget is here (a share of 1), so it is the subject's own that is used up.
    expect([tenant?.fits, tenant?.result?.remaining, tenant?.charge]).toEqual([true, 10, undefined]);
    expect([user?.fits, user?.result?.remaining, user?.result?.reason, user?.result?.retryAfterMs]).toEqual([
      false,
      1,
      'subject_exhausted',
      2000,
    ]);
    expect(await held(s, 'tenant', 'acme')).toBe(10);
    // A cost above what this region's part can ever hold: no wait helps.
    const s2 = (steps = decisionSteps(policies, { shares: { user: 0.5 } }));
    const costly = group(s2, { policy: 'user', subject: 'acme', cost: 3 });
    await runStoreGroup(s2.deps, costly.call);
    expect([costly.checks[0]?.result?.reason, costly.checks[0]?.result?.retryAfterMs]).toEqual([
      'cost_exceeds_share',
      null,
    ]);
    s.close();
  });

  it('a look reports what the buckets hold and charges nothing', async () => {
    const s = (steps = decisionSteps(policies));
    const { checks, call } = group(s, { policy: 'tenant', subject: 'acme', cost: 4 }, { lookOnly: true });
    const run = await runStoreGroup(s.deps, call);
    expect(run).toMatchObject({ allowed: true, charged: false, fresh: false });
    expect([checks[0]?.result?.remaining, checks[0]?.fits, checks[0]?.charge]).toEqual([10, true, undefined]);
    expect(await held(s, 'tenant', 'acme')).toBe(10);
  });

  it("a store that fails: each check gets its policy's failure mode", async () => {
    const s = (steps = decisionSteps(policies));
    s.deps.store = Object.assign(Object.create(s.store) as DecisionStore, {
      decide: () => Promise.reject(new Error('ECONNREFUSED')),
    });
    const { checks, call } = group(s, {
      checks: [
        { policy: 'tenant', subject: 'acme' },
        { policy: 'open', subject: 'acme' },
      ],
    });
    const run = await runStoreGroup(s.deps, call);
    expect(run.allowed).toBe(false);
    expect(checks.map((c) => [c.result?.reason, c.fits, c.charge])).toEqual([
      ['store_unavailable', false, undefined],
      ['fail_open', true, undefined],
    ]);
  });

  it('a retry with the same idempotency key replays: charged once, and the replay still names its charge', async () => {
    const s = (steps = decisionSteps(policies));
    const first = group(s, { policy: 'tenant', subject: 'acme', cost: 2 }, { idempotencyKey: 'k1' });
    await runStoreGroup(s.deps, first.call);
    const retry = group(s, { policy: 'tenant', subject: 'acme', cost: 2 }, { idempotencyKey: 'k1' });
    const run = await runStoreGroup(s.deps, retry.call);
    expect(run).toMatchObject({ allowed: true, replayed: true, fresh: false, charged: true });
    expect(retry.checks[0]?.result?.remaining).toBe(8);
    expect(retry.checks[0]?.charge).toMatchObject({ kind: 'bucket', cost: 2 });
    expect(await held(s, 'tenant', 'acme')).toBe(8);
  });

  it('a regional refusal short of tokens goes to the borrowing port; its reason is the one the port gives', async () => {
    const asked: ShortCheck[][] = [];
    const shortfall: ShortfallHandler = {
      cover: (short) => {
        asked.push([...short]);
        return Promise.resolve({ covered: false, reasons: ['subject_exhausted'] });
      },
    };
    const s = (steps = decisionSteps(policies, { shares: { tenant: 0.5 }, shortfall }));
    // This region holds half the tenant's budget: 5 tokens. 4 are taken, then 3 more are asked for.
    await runStoreGroup(s.deps, group(s, { policy: 'tenant', subject: 'acme', cost: 4 }).call);
    const { checks, call } = group(s, { policy: 'tenant', subject: 'acme', cost: 3 });
    const run = await runStoreGroup(s.deps, call);
    expect(run.allowed).toBe(false);
    expect(asked).toHaveLength(1);
    expect(
      asked[0]?.map((a) => [a.check.policy.name, a.check.subject, a.check.bucket.capacity, a.remaining]),
    ).toEqual([['tenant', 'acme', 5, 1]]);
    expect([checks[0]?.result?.reason, checks[0]?.fits]).toEqual(['subject_exhausted', false]);
  });
});
