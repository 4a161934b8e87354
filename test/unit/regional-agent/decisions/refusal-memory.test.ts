/**
 * The last refusal an agent remembers per (policy, subject) for `GET /v1/explain`, and the reason an ordinary
 * refusal carries when nothing borrows: an agent on the model store, driven by a manual clock.
 */
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse, ExplainResponse } from '../../../../core/wire/agent.js';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { StaticShareView, type ShareView } from '../../../../core/shares/shares.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig, ConfigError, loadConfig } from '../../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';

const START = Date.parse('2026-12-04T10:00:00.000Z');
const SECRET = 'a-secret-of-enough-length';

function agent(
  options: { share?: number; shares?: ShareView; explainRefusals?: number; hmacSecret?: string } = {},
) {
  const clock = new ManualClock(START);
  const built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource([
        // 10 tokens, next to no refill: counts stay exact for the length of a test.
        parsePolicy({ name: 'writes', capacity: 10, refillPerSecond: 0.001, maxCost: 10 }),
        parsePolicy({
          name: 'home',
          capacity: 4,
          refillPerSecond: 0.001,
          mode: 'strict',
          homeRegion: 'us',
          maxCost: 4,
        }),
      ]),
      shares: options.shares ?? new StaticShareView({ writes: options.share ?? 1 }),
      log: pino({ level: 'silent' }),
      clock,
      random: () => 1,
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: 'redis://127.0.0.1:1',
      policiesFile: 'unused',
      ...(options.explainRefusals === undefined ? {} : { explainRefusals: options.explainRefusals }),
      ...(options.hmacSecret === undefined ? {} : { hmacSecret: options.hmacSecret }),
    }),
  );
  const decide = async (body: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
    expect(res.statusCode, res.body).toBe(200);
    return DecisionResponse.parse(res.json());
  };
  const explain = async (policy: string, subject: string) => {
    await built.ready;
    const res = await built.app.inject({ url: `/v1/explain?policy=${policy}&subject=${subject}` });
    expect(res.statusCode, res.body).toBe(200);
    return ExplainResponse.parse(res.json());
  };
  const gauge = async () => {
    const text = await built.metrics.registry.metrics();
    return Number(/^quotaplane_explain_refusals (\d+)$/m.exec(text)?.[1]);
  };
  return { built, clock, decide, explain, gauge };
}

describe('the last refusal of a subject', () => {
  it('is remembered from a charging refusal, with its time, reason and whole numbers', async () => {
    const a = agent({ share: 0.5 });
    expect((await a.explain('writes', 't-1')).lastRefusal).toBeNull();
    // A share of 0.5 of 10 tokens: 5 here.
    expect((await a.decide({ policy: 'writes', subject: 't-1', cost: 4 })).allowed).toBe(true);
    a.clock.advance(1500);
    const refused = await a.decide({ policy: 'writes', subject: 't-1', cost: 2 });
    expect(refused.allowed).toBe(false);
    // Borrowing off (no shortfall handler): a part of the budget is used up, the rest may be elsewhere.
    expect(refused.results[0]!.reason).toBe('share_exhausted');
    const after = await a.explain('writes', 't-1');
    expect(after.lastRefusal).toEqual({
      at: '2026-12-04T10:00:01.500Z',
      reason: 'share_exhausted',
      cost: 2,
      limit: 5,
      remaining: 1,
      retryAfterMs: refused.results[0]!.retryAfterMs,
    });
    expect(await a.gauge()).toBe(1);
    // Another subject's refusal is its own entry; the first one's stays.
    await a.decide({ policy: 'writes', subject: 't-2', cost: 6 });
    expect((await a.explain('writes', 't-2')).lastRefusal).toMatchObject({ reason: 'cost_exceeds_share' });
    expect((await a.explain('writes', 't-1')).lastRefusal?.at).toBe('2026-12-04T10:00:01.500Z');
    expect(await a.gauge()).toBe(2);
  });

  it('is not written by dry runs, explanations or admissions', async () => {
    const a = agent();
    await a.decide({ policy: 'writes', subject: 't-3', cost: 10 });
    // The bucket is empty: a dry run and an explanation would be refused, and neither is a refusal.
    const dry = await a.decide({ policy: 'writes', subject: 't-3', cost: 1, dryRun: true });
    expect(dry.allowed).toBe(false);
    const looked = await a.explain('writes', 't-3');
    expect(looked).toMatchObject({ wouldAllow: false, remaining: 0, reason: 'subject_exhausted' });
    expect(looked.lastRefusal).toBeNull();
    expect(await a.gauge()).toBe(0);
  });

  it('is remembered by the region that answered the caller, not by the home a strict check was forwarded to', async () => {
    const a = agent();
    await a.built.ready;
    const forwarded = (cost: number) =>
      a.built.service.decideForwarded(
        {
          fromRegion: 'eu',
          checks: [{ policy: 'home', subject: 't-6', cost }],
          dryRun: false,
          budgetMs: 1000,
        },
        'fwd',
      );
    await forwarded(4);
    const refused = await forwarded(1);
    expect(refused).toMatchObject({ results: [{ allowed: false, reason: 'subject_exhausted' }] });
    expect((await a.explain('home', 't-6')).lastRefusal).toBeNull();
    // The same refusal asked here directly is this region's own.
    await a.decide({ policy: 'home', subject: 't-6' });
    expect((await a.explain('home', 't-6')).lastRefusal).toMatchObject({
      reason: 'subject_exhausted',
      limit: 4,
    });
  });

  it('keeps the subject as the agent keys it (hashed with a secret), never in a metric', async () => {
    const a = agent({ hmacSecret: SECRET });
    await a.decide({ policy: 'writes', subject: 'alice@example.com', cost: 10 });
    await a.decide({ policy: 'writes', subject: 'alice@example.com', cost: 1 });
    const seen = await a.explain('writes', 'alice%40example.com');
    expect(seen.lastRefusal).toMatchObject({ reason: 'subject_exhausted', remaining: 0, limit: 10 });
    const text = await a.built.metrics.registry.metrics();
    const hashed = normalizeSubject('alice@example.com', { hmacSecret: SECRET });
    expect(hashed.ok).toBe(true);
    expect(text).not.toContain('alice');
    expect(text).not.toContain(hashed.ok ? hashed.subject : '?');
  });

  it("shows the share of the subject as the agent keys it: a hashed subject's own share", async () => {
    // A share of its own for the hashed subject (as the coordinator keys overrides), the policy's for any other.
    const shares: ShareView = {
      shareFor: (_policy, subject) => ({ share: subject.startsWith('h.') ? 0.5 : 1, epoch: 1 }),
      enter: () => () => undefined,
    };
    const a = agent({ shares, hmacSecret: SECRET });
    expect(await a.explain('writes', 'bob')).toMatchObject({ share: 0.5, limit: 5, remaining: 5 });
  });

  it('is bounded by QP_EXPLAIN_REFUSALS: the least recently refused subject is forgotten first', async () => {
    const a = agent({ explainRefusals: 2 });
    for (const s of ['s-1', 's-2', 's-3']) {
      await a.decide({ policy: 'writes', subject: s, cost: 10 });
      expect((await a.decide({ policy: 'writes', subject: s })).allowed).toBe(false);
    }
    expect(await a.gauge()).toBe(2);
    expect((await a.explain('writes', 's-1')).lastRefusal).toBeNull();
    expect((await a.explain('writes', 's-2')).lastRefusal).not.toBeNull();
    expect((await a.explain('writes', 's-3')).lastRefusal).not.toBeNull();
    const none = agent({ explainRefusals: 0 });
    await none.decide({ policy: 'writes', subject: 's-1', cost: 10 });
    expect((await none.decide({ policy: 'writes', subject: 's-1' })).allowed).toBe(false);
    expect((await none.explain('writes', 's-1')).lastRefusal).toBeNull();
  });
});

describe('the reason of an ordinary refusal when nothing borrows', () => {
  it('is subject_exhausted when the bucket holds the whole budget: share 1, or a strict policy at home', async () => {
    const a = agent({ share: 1 });
    await a.decide({ policy: 'writes', subject: 't-4', cost: 10 });
    const refused = await a.decide({ policy: 'writes', subject: 't-4' });
    expect(refused).toMatchObject({
      allowed: false,
      results: [{ reason: 'subject_exhausted', remaining: 0 }],
    });
    await a.decide({ policy: 'home', subject: 't-4', cost: 4 });
    const strict = await a.decide({ policy: 'home', subject: 't-4' });
    expect(strict.results[0]).toMatchObject({ mode: 'strict', reason: 'subject_exhausted' });
  });

  it('is share_exhausted when the bucket holds a part of it; an admission carries none', async () => {
    const a = agent({ share: 0.3 });
    const ok = await a.decide({ policy: 'writes', subject: 't-5', cost: 3 });
    expect(ok.results[0]!.reason).toBeUndefined();
    const refused = await a.decide({ policy: 'writes', subject: 't-5' });
    expect(refused.results[0]).toMatchObject({ allowed: false, reason: 'share_exhausted', limit: 3 });
  });
});

describe('QP_EXPLAIN_REFUSALS', () => {
  const base = { QP_REGION: 'us', QP_REDIS_URL: 'redis://127.0.0.1:6390', QP_POLICIES_FILE: 'p.json' };
  it('defaults to 10,000 and refuses values outside 0..1,000,000 with a clear problem', () => {
    expect(loadConfig(base).explainRefusals).toBe(10_000);
    expect(loadConfig({ ...base, QP_EXPLAIN_REFUSALS: '0' }).explainRefusals).toBe(0);
    for (const bad of ['-1', '1000001', '2.5', 'lots']) {
      let problems: readonly string[] = [];
      try {
        loadConfig({ ...base, QP_EXPLAIN_REFUSALS: bad });
      } catch (error) {
        expect(error).toBeInstanceOf(ConfigError);
        problems = (error as ConfigError).problems;
      }
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^QP_EXPLAIN_REFUSALS \(explainRefusals\): /);
    }
  });
});
