import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse, looksValidDecisionRequest } from '../../../core/wire/agent.js';
import { ManualClock } from '../../../core/clock.js';
import { parsePolicy, PolicySpec, withClass } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';

const api = parsePolicy({
  name: 'api',
  capacity: 10,
  refillPerSecond: 1e-4,
  classes: {
    enterprise: { capacity: 100, refillPerSecond: 1e-3, maxCost: 50 },
    free: { capacity: 2, refillPerSecond: 1e-5 },
  },
  subjects: { 'tenant-big': 'enterprise' },
});
const guesses = parsePolicy({
  name: 'guesses',
  kind: 'sliding_log',
  capacity: 5,
  windowSeconds: 600,
  classes: { staff: { capacity: 50 } },
});

function agent(share = 1) {
  const clock = new ManualClock(1_750_000_000_000);
  const built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource([api, guesses]),
      shares: new StaticShareView({ api: share, guesses: share }),
      log: pino({ level: 'silent' }),
      clock,
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: 'redis://127.0.0.1:1',
      policiesFile: 'unused',
      reservationSweepMs: 0,
    }),
  );
  return async (body: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
    return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
  };
}

describe('subject classes: the schema', () => {
  it('fills each class as the policy is filled; the idle TTL covers the slowest class', () => {
    expect(api.classes).toEqual({
      enterprise: { capacity: 100, refillPerSecond: 1e-3, maxCost: 50 },
      free: { capacity: 2, refillPerSecond: 1e-5, maxCost: 1 },
    });
    expect(api.idleTtlSeconds).toBe(200_000);
    expect(guesses.classes).toEqual({ staff: { capacity: 50, refillPerSecond: 50 / 600, maxCost: 1 } });
    expect(withClass(api, 'enterprise')).toMatchObject({
      name: 'api',
      capacity: 100,
      refillPerSecond: 1e-3,
      maxCost: 50,
    });
    expect(withClass(api, undefined)).toBe(api);
  });

  it('refuses, never caps: every problem of every class is listed', () => {
    const r = PolicySpec.safeParse({
      capacity: 10,
      refillPerSecond: 1,
      idleTtlSeconds: 20,
      minShare: 0.1,
      classes: {
        big: { capacity: 100, refillPerSecond: 1, maxCost: 200 },
        norate: { capacity: 5 },
      },
      subjects: { 't-1': 'missing' },
    });
    expect(r.success).toBe(false);
    expect(r.error?.issues.map((i) => i.path.join('.')).sort()).toEqual(
      [
        'idleTtlSeconds',
        'minShare', // big: 0.1 × 100 < its maxCost 200
        'minShare', // norate: 0.1 × 5 < its maxCost 1
        'classes.big.maxCost',
        'classes.norate.refillPerSecond',
        'subjects.t-1',
      ].sort(),
    );
    // Field rules come first (as for the policy's own fields): a bad class name is refused on its own.
    const named = PolicySpec.safeParse({
      capacity: 1,
      refillPerSecond: 1,
      classes: { 'Bad Name': { capacity: 1 } },
    });
    expect(named.error?.issues.map((i) => i.path.join('.'))).toEqual(['classes.Bad Name']);
    const log = PolicySpec.safeParse({
      kind: 'sliding_log',
      capacity: 5,
      windowSeconds: 60,
      classes: { a: { capacity: 2.5, refillPerSecond: 1, maxCost: 1.5 } },
    });
    expect(log.error?.issues.map((i) => i.path.join('.')).sort()).toEqual([
      'classes.a.capacity',
      'classes.a.maxCost',
      'classes.a.refillPerSecond',
    ]);
    const many = Object.fromEntries(
      Array.from({ length: 33 }, (_, i) => [`c${i}`, { capacity: 1, refillPerSecond: 1 }]),
    );
    expect(PolicySpec.safeParse({ capacity: 1, refillPerSecond: 1, classes: many }).success).toBe(false);
  });

  it('a check may name its class on the wire; the fast check and zod agree', () => {
    expect(looksValidDecisionRequest({ policy: 'api', subject: 's', class: 'enterprise' })).toBe(true);
    expect(looksValidDecisionRequest({ checks: [{ policy: 'api', subject: 's', class: 'free' }] })).toBe(
      true,
    );
    expect(looksValidDecisionRequest({ policy: 'api', subject: 's', class: 'Enterprise' })).toBe(false);
    expect(looksValidDecisionRequest({ policy: 'api', subject: 's', class: 3 })).toBe(false);
  });
});

describe('subject classes in decisions', () => {
  it('a named subject gets its class: 100 for tenant-big, 10 for anyone else; a check may name a class', async () => {
    const post = agent();
    const big = await post({ policy: 'api', subject: 'tenant-big', cost: 50 });
    expect(DecisionResponse.parse(big.body).results[0]).toMatchObject({
      allowed: true,
      limit: 100,
      remaining: 50,
    });
    const small = await post({ policy: 'api', subject: 'tenant-small', cost: 50 });
    expect(small.body).toMatchObject({ status: 400, code: 'AGT_ERR_COST_ABOVE_MAX' });
    const free = await post({ checks: [{ policy: 'api', subject: 'tenant-free', class: 'free' }] });
    expect(DecisionResponse.parse(free.body).results[0]).toMatchObject({ limit: 2, remaining: 1 });
    const log = await post({ policy: 'guesses', subject: 'admin', class: 'staff' });
    expect(DecisionResponse.parse(log.body).results[0]).toMatchObject({ limit: 50, remaining: 49 });
  });

  it('an unknown class is 400 AGT_ERR_UNKNOWN_CLASS and charges nothing', async () => {
    const post = agent();
    const r = await post({ policy: 'api', subject: 'tenant-x', class: 'gold' });
    expect(r.body).toMatchObject({ status: 400, code: 'AGT_ERR_UNKNOWN_CLASS' });
    const after = await post({ policy: 'api', subject: 'tenant-x', dryRun: true });
    expect(DecisionResponse.parse(after.body).results[0]).toMatchObject({ remaining: 9 });
  });

  it("a class's bucket is sized by the same share as the default's", async () => {
    const post = agent(0.25);
    const big = DecisionResponse.parse((await post({ policy: 'api', subject: 'tenant-big' })).body);
    expect(big.results[0]).toMatchObject({ limit: 25 });
    const anyone = DecisionResponse.parse((await post({ policy: 'api', subject: 'tenant-small' })).body);
    expect(anyone.results[0]).toMatchObject({ limit: 2 });
  });
});
