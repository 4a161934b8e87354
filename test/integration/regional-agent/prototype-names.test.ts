/**
 * Issue 25: prototype names. Subjects, classes and other names callers send are looked up in records a policy
 * carries (`classes`, `subjects`): "constructor", "__proto__" and "toString" must be ordinary names there, never
 * Object.prototype's members. Before the fix, the subjects got 500 AGT_ERR_INTERNAL, and `"class": "constructor"`
 * on a fail-open policy was admitted without charge (30 of 30 on a capacity of 10: the lookup found `Object`, the
 * bucket was sized NaN, and the store's refusal was answered by the failure mode). The schema and core lookups are
 * tested in test/unit/core/own-keys.test.ts.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { ClassName, parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';
import { agentOnRedis } from '../../helpers/agent-fixture.js';
import { redisSnapshot } from '../../helpers/redis-snapshot.js';

const PROTOTYPE_NAMES = ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf'] as const;

const redis = sharedRedis();
afterAll(() => redis.disconnect());

/** Fresh policy names each run, so every bucket starts full. */
function classPolicies(onStoreFailure: 'open' | 'closed' | 'local') {
  return parsePolicy({
    name: uniquePrefix(`tiers-${onStoreFailure}`),
    capacity: 10,
    refillPerSecond: 1e-4,
    onStoreFailure,
    classes: { enterprise: { capacity: 100, refillPerSecond: 1e-3 } },
    subjects: { 'tenant-big': 'enterprise' },
  });
}

async function decide(agent: AgentApp, body: object) {
  const r = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
  return { status: r.statusCode, body: r.json<Record<string, unknown>>() };
}

describe('prototype names are ordinary names', () => {
  it('subjects named constructor, __proto__, toString: ordinary decisions of the default class (10 of 30)', async () => {
    const policy = classPolicies('open');
    const agent = agentOnRedis(redis, [policy], { shares: new StaticShareView({ [policy.name]: 1 }) });
    await agent.ready;
    try {
      for (const subject of PROTOTYPE_NAMES) {
        let admitted = 0;
        for (let i = 0; i < 30; i++) {
          const r = await decide(agent, { policy: policy.name, subject });
          expect(r.status, `${subject}: ${JSON.stringify(r.body)}`).toBe(200);
          const d = DecisionResponse.parse(r.body);
          expect(d.results[0]).toMatchObject({ limit: 10 });
          expect(d.results[0]?.reason === 'fail_open').toBe(false);
          if (d.allowed) admitted++;
        }
        expect(admitted, subject).toBe(10);
      }
    } finally {
      await agent.app.close();
    }
  });

  /** `constructor` is a well-formed class name the policy does not define; the others are not class names at all. */
  const classRefusal = (name: string) =>
    ClassName.safeParse(name).success ? 'AGT_ERR_UNKNOWN_CLASS' : 'AGT_ERR_INVALID_REQUEST';

  it('"class": "constructor" (and every prototype name) on a fail-open policy: a 400, never admitted, nothing charged', async () => {
    const policy = classPolicies('open');
    const agent = agentOnRedis(redis, [policy], { shares: new StaticShareView({ [policy.name]: 1 }) });
    await agent.ready;
    const subject = uniquePrefix('tenant');
    try {
      // Every key this test's subject or policy could touch (the Redis may be shared with other test files).
      const mine = [`*${subject}*`, `*${policy.name}*`];
      const before = await redisSnapshot(redis, mine);
      let admitted = 0;
      for (const cls of PROTOTYPE_NAMES) {
        for (let i = 0; i < 30 / PROTOTYPE_NAMES.length; i++) {
          const r = await decide(agent, { policy: policy.name, subject, class: cls });
          if (r.status === 200 && r.body['allowed'] === true) admitted++;
          expect(r.status, `${cls}: ${JSON.stringify(r.body)}`).toBe(400);
          expect(r.body['code']).toBe(classRefusal(cls));
        }
      }
      expect(admitted).toBe(0);
      expect(await redisSnapshot(redis, mine)).toBe(before);
      // The subject's own bucket was never touched: its first ten decisions are admitted, the rest refused.
      let ordinary = 0;
      for (let i = 0; i < 30; i++) {
        const d = DecisionResponse.parse((await decide(agent, { policy: policy.name, subject })).body);
        if (d.allowed) ordinary++;
      }
      expect(ordinary).toBe(10);
      // The patterns see the keys a charge writes, so the unchanged snapshot above meant something.
      expect(await redisSnapshot(redis, mine)).not.toBe(before);
    } finally {
      await agent.app.close();
    }
  });

  it('the same names in layered checks and dry runs: never a 5xx, never a failure mode', async () => {
    const policies = (['closed', 'local'] as const).map(classPolicies);
    const agent = agentOnRedis(redis, policies, {
      shares: new StaticShareView(Object.fromEntries(policies.map((p) => [p.name, 1]))),
    });
    await agent.ready;
    try {
      for (const name of PROTOTYPE_NAMES) {
        const checks = policies.map((p) => ({ policy: p.name, subject: name }));
        const plain = await decide(agent, { checks, dryRun: true });
        expect(plain.status, JSON.stringify(plain.body)).toBe(200);
        for (const result of DecisionResponse.parse(plain.body).results)
          expect(result.reason).toBeUndefined();
        const named = await decide(agent, {
          checks: policies.map((p) => ({ policy: p.name, subject: 'x', class: name })),
        });
        expect(named.status).toBe(400);
        expect(named.body['code']).toBe(classRefusal(name));
      }
    } finally {
      await agent.app.close();
    }
  });
});
