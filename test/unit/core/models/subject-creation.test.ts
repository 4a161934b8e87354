import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { ManualClock } from '../../../../core/clock.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy, PolicySpec, type PolicyInput } from '../../../../core/policy/policy.js';
import { sizedBucket } from '../../../../core/shares/share-sizing.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import {
  ANONYMOUS_SUBJECT,
  CreationLogModel,
  creationKey,
  sharedBucketKey,
  SubjectCreationModel,
} from '../../../../core/models/subject-creation.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import {
  CASE_WINDOW_MS,
  caseLogKey,
  prepareCreationCase,
  subjectCreationCases,
} from '../../../cases/subject-creation-cases.js';
import { eventually } from '../../../helpers/wait.js';

const base = { capacity: 5, refillPerSecond: 0.01 };

describe('newSubjects: the schema', () => {
  it('fills the flood answer (deny) and keeps the cap', () => {
    const p = parsePolicy({ name: 'api', ...base, newSubjects: { perMinute: 100 } });
    expect(p.newSubjects).toEqual({ perMinute: 100, flood: 'deny' });
    expect(
      parsePolicy({ name: 'a', ...base, newSubjects: { perMinute: 1, flood: 'shared' } }).newSubjects,
    ).toEqual({ perMinute: 1, flood: 'shared' });
  });

  it('refuses bad values, listing every problem', () => {
    const r = PolicySpec.safeParse({
      ...base,
      newSubjects: { perMinute: 2.5, flood: 'maybe', extra: 1 },
    });
    expect(r.success).toBe(false);
    const problems = r.error!.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
    expect(problems).toEqual(
      expect.arrayContaining([
        'newSubjects.perMinute: newSubjects.perMinute must be a whole number',
        expect.stringMatching(/^newSubjects\.flood: /),
        expect.stringMatching(/^newSubjects: .*extra/),
      ]),
    );
    expect(problems).toHaveLength(3);
    for (const perMinute of [0, -1, 100_001]) {
      expect(PolicySpec.safeParse({ ...base, newSubjects: { perMinute } }).success, String(perMinute)).toBe(
        false,
      );
    }
  });

  it('is for unsharded token buckets only', () => {
    const log = PolicySpec.safeParse({
      kind: 'sliding_log',
      capacity: 5,
      windowSeconds: 60,
      newSubjects: { perMinute: 10 },
    });
    expect(log.error?.issues.map((i) => i.message)).toEqual(['newSubjects is for token buckets only']);
    const sharded = PolicySpec.safeParse({
      ...base,
      capacity: 100,
      shards: 4,
      newSubjects: { perMinute: 10 },
    });
    expect(sharded.error?.issues.map((i) => i.path.join('.'))).toEqual(['newSubjects']);
  });
});

const NOW = 1_750_000_000_000_000;

describe('SubjectCreationModel: the reference model', () => {
  const policy = parsePolicy({ name: 'api', ...base, newSubjects: { perMinute: 3, flood: 'shared' } });
  const subject = (s: string) => sizedBucket(policy, bucketKey(1, s, 'api'), 1, 1);
  const shared = sizedBucket(policy, sharedBucketKey(1, 'api'), 1, 1);

  it('creates at most perMinute buckets per rolling minute; known subjects are decided as before', () => {
    const m = new SubjectCreationModel();
    const steps = ['a', 'b', 'c', 'd', 'e', 'a'].map((s) => m.decide(policy, subject(s), shared, NOW).step);
    expect(steps).toEqual(['created', 'created', 'created', 'flood', 'flood', 'known']);
    // a, b, c and the shared bucket; d and e were decided on the shared bucket.
    expect(m.bucketKeys(NOW)).toBe(4);
    const a = m.decide(policy, subject('a'), shared, NOW);
    expect(a.reply?.results[0]?.remaining).toBe(2_000_000);
    // The shared bucket took d and e: 3 tokens left of 5.
    expect(m.decide(policy, subject('f'), shared, NOW).reply?.results[0]?.remaining).toBe(2_000_000);
  });

  it('a creation comes back exactly one minute after it was taken', () => {
    const m = new SubjectCreationModel();
    for (const s of ['a', 'b', 'c']) m.decide(policy, subject(s), shared, NOW);
    const late = m.decide(policy, subject('d'), shared, NOW + 59_999_000);
    expect(late.step).toBe('flood');
    expect(late.creation).toEqual({ outcome: 'full', remaining: 0, retryAfterMs: 1 });
    expect(m.decide(policy, subject('d2'), shared, NOW + 60_000_000).step).toBe('created');
  });

  it('deny answers without touching a bucket; a dry run takes no creation', () => {
    const deny = parsePolicy({ name: 'api', ...base, newSubjects: { perMinute: 1 } });
    const m = new SubjectCreationModel();
    expect(m.decide(deny, subject('x'), shared, NOW, true).step).toBe('created');
    expect(m.bucketKeys(NOW)).toBe(0);
    expect(m.decide(deny, subject('x'), shared, NOW).step).toBe('created');
    const flood = m.decide(deny, subject('y'), shared, NOW);
    expect(flood).toMatchObject({ step: 'flood', key: undefined, reply: undefined });
    expect(m.bucketKeys(NOW)).toBe(1);
  });

  it('a subject whose bucket is gone within the minute is created again without a second creation', () => {
    // An idle TTL shorter than the minute: the bucket expires while its creation is still in the window.
    const brief = parsePolicy({
      name: 'api',
      capacity: 5,
      refillPerSecond: 1,
      idleTtlSeconds: 10,
      newSubjects: { perMinute: 1 },
    });
    const m = new SubjectCreationModel();
    const key = (s: string) => sizedBucket(brief, bucketKey(1, s, 'api'), 1, 1);
    expect(m.decide(brief, key('a'), shared, NOW).creation?.outcome).toBe('taken');
    const again = m.decide(brief, key('a'), shared, NOW + 30_000_000);
    expect(again).toMatchObject({ step: 'created', creation: { outcome: 'held', remaining: 0 } });
    expect(m.decide(brief, key('b'), shared, NOW + 30_000_000).step).toBe('flood');
  });

  it('keys are apart: the creation log in a slot of its own, the shared bucket under a subject no caller has', () => {
    expect(creationKey('api')).toBe('rl:new-subjects:{#api}');
    expect(sharedBucketKey(3, 'api')).toBe(`rl:v3:{${ANONYMOUS_SUBJECT}}:api`);
  });
});

describe('CreationLogModel: the case table (lua/subject_creation.lua runs it too)', () => {
  for (const c of subjectCreationCases) {
    it(c.name, () => {
      const model = new CreationLogModel();
      const problems: string[] = [];
      prepareCreationCase('p', c).forEach(({ step, request, nowMicros }, i) => {
        const { entries, ...reply } = step.expect;
        const got = model.take(request, nowMicros);
        const held = model
          .entries(caseLogKey('p'), nowMicros)
          .filter(([, s]) => s > nowMicros - CASE_WINDOW_MS * 1000).length;
        if (JSON.stringify(got) !== JSON.stringify(reply) || held !== entries)
          problems.push(`call ${i} (at ${step.at}): ${JSON.stringify({ ...got, entries: held })}`);
      });
      expect(problems).toEqual([]);
    });
  }
});

function agent(over: Partial<PolicyInput>) {
  const clock = new ManualClock(1_750_000_000_000);
  const policies = [parsePolicy({ name: 'api', ...base, ...over }), parsePolicy({ name: 'plain', ...base })];
  const store = new ModelDecisionStore(clock, (key) => (key.includes('{#') ? 2 : key.includes('{t') ? 1 : 0));
  const built = buildApp(
    {
      store,
      policies: new StaticPolicySource(policies),
      shares: new StaticShareView({ api: 1, plain: 1 }),
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
  const decide = async (body: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
    return { status: res.statusCode, body: DecisionResponse.parse(res.json()) };
  };
  const metric = async (name: 'subjectFlood' | 'subjectsCreated') => {
    const m = await built.metrics[name].get();
    return m.values.map((v) => ({ ...v.labels, value: v.value }));
  };
  return { decide, clock, metric, store };
}

describe('the agent with a subject-creation cap (model store)', () => {
  it('deny: past the cap a new subject is refused with subject_flood; known ones keep their quota', async () => {
    const { decide, clock, metric } = agent({ newSubjects: { perMinute: 2 } });
    expect((await decide({ policy: 'api', subject: 'ta' })).body.allowed).toBe(true);
    expect((await decide({ policy: 'api', subject: 'tb' })).body.allowed).toBe(true);
    const flood = await decide({ policy: 'api', subject: 'tc' });
    expect(flood.status).toBe(200);
    expect(flood.body.results[0]).toMatchObject({
      allowed: false,
      reason: 'subject_flood',
      remaining: 0,
      limit: 5,
      retryAfterMs: 60_000,
    });
    // ta keeps its whole quota: 4 more of 5, then its own bucket refuses: the subject used its own budget (its
    // bucket holds all of it here), not a flood answer.
    for (let i = 0; i < 4; i++)
      expect((await decide({ policy: 'api', subject: 'ta' })).body.allowed).toBe(true);
    const empty = await decide({ policy: 'api', subject: 'ta' });
    expect(empty.body.allowed).toBe(false);
    expect(empty.body.results[0]?.reason).toBe('subject_exhausted');
    clock.advance(60_000);
    expect((await decide({ policy: 'api', subject: 'tc' })).body.allowed).toBe(true);
    expect(await metric('subjectFlood')).toEqual([{ policy: 'api', answer: 'deny', value: 1 }]);
    expect(await metric('subjectsCreated')).toEqual([{ policy: 'api', value: 3 }]);
  });

  it('deny in a layered request: nothing charged anywhere, the other check reports its bucket', async () => {
    const { decide } = agent({ newSubjects: { perMinute: 1 } });
    await decide({ policy: 'api', subject: 'ta' });
    const r = await decide({
      checks: [
        { policy: 'plain', subject: 'tz' },
        { policy: 'api', subject: 'tq' },
      ],
    });
    expect(r.body.allowed).toBe(false);
    expect(r.body.results.map((x) => [x.reason ?? null, x.remaining])).toEqual([
      [null, 5],
      ['subject_flood', 0],
    ]);
    // plain's bucket for tz was never charged.
    const again = await decide({ policy: 'plain', subject: 'tz' });
    expect(again.body.results[0]?.remaining).toBe(4);
  });

  it('shared: past the cap new subjects share one bucket sized like a subject’s', async () => {
    const { decide, metric } = agent({ newSubjects: { perMinute: 1, flood: 'shared' } });
    expect((await decide({ policy: 'api', subject: 'ta' })).body.results[0]?.reason).toBeUndefined();
    const answers: (string | null)[] = [];
    for (let i = 0; i < 7; i++) {
      const r = await decide({ policy: 'api', subject: `u${i}` });
      answers.push(r.body.allowed ? 'allowed' : 'denied');
      expect(r.body.results[0]?.reason).toBe('shared_bucket');
    }
    // Five tokens in the shared bucket, then refused there.
    expect(answers).toEqual(['allowed', 'allowed', 'allowed', 'allowed', 'allowed', 'denied', 'denied']);
    expect((await decide({ policy: 'api', subject: 'ta' })).body.results[0]?.remaining).toBe(3);
    expect(await metric('subjectFlood')).toEqual([{ policy: 'api', answer: 'shared', value: 7 }]);
  });

  it('shared in a layered request across slots: regrouped, all-or-nothing, refunded on a later denial', async () => {
    const { decide } = agent({ newSubjects: { perMinute: 1, flood: 'shared' } });
    await decide({ policy: 'api', subject: 'ta' });
    // plain/tz (slot 1) and api/tq (slot 1) share a group; api/tq moves to the shared bucket (slot 2).
    const r = await decide({
      checks: [
        { policy: 'plain', subject: 'tz' },
        { policy: 'api', subject: 'tq' },
      ],
    });
    expect(r.body.allowed).toBe(true);
    expect(r.body.results.map((x) => [x.reason ?? null, x.remaining])).toEqual([
      [null, 4],
      ['shared_bucket', 4],
    ]);
    // Drain the shared bucket, then a layered request is refused and plain/tz is given back.
    for (let i = 0; i < 4; i++) await decide({ policy: 'api', subject: `v${i}` });
    const refused = await decide({
      checks: [
        { policy: 'plain', subject: 'tz' },
        { policy: 'api', subject: 'tr' },
      ],
    });
    expect(refused.body.allowed).toBe(false);
    expect(refused.body.results[1]?.reason).toBe('shared_bucket');
    const tz = await decide({ policy: 'plain', subject: 'tz', dryRun: true });
    expect(tz.body.results[0]?.remaining).toBe(3);
  });

  it('a dry run takes no creation and answers as the real decision would', async () => {
    const { decide } = agent({ newSubjects: { perMinute: 1 } });
    expect((await decide({ policy: 'api', subject: 'ta', dryRun: true })).body.allowed).toBe(true);
    expect((await decide({ policy: 'api', subject: 'ta' })).body.allowed).toBe(true);
    const dry = await decide({ policy: 'api', subject: 'tb', dryRun: true });
    expect(dry.body.results[0]?.reason).toBe('subject_flood');
  });

  it('racing first decisions of one new subject share one creation call and cost one creation', async () => {
    const { decide, metric, store } = agent({ newSubjects: { perMinute: 2 } });
    // Hold the creation call until every racer has found the bucket missing.
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const take = store.takeCreation.bind(store);
    let takes = 0;
    store.takeCreation = async (request) => {
      takes++;
      await gate;
      return take(request);
    };
    const inner = store.decide.bind(store);
    let missing = 0;
    store.decide = async (request) => {
      const d = await inner(request);
      if (d.missing !== undefined) missing++;
      return d;
    };
    const racers = Array.from({ length: 50 }, () => decide({ policy: 'api', subject: 'burst' }));
    await eventually(() => missing === 50, 5000, 'every racer found the bucket missing', 1);
    // Every racer's continuation after its missing answer runs before this timer: all of them are waiting.
    await new Promise((r) => setTimeout(r, 0));
    release();
    const all = await Promise.all(racers);
    expect(takes).toBe(1);
    // One bucket of 5: exactly 5 admitted, the other 45 refused by it, none by the cap.
    expect(all.filter((r) => r.body.allowed)).toHaveLength(5);
    expect(all.filter((r) => r.body.results[0]?.reason === 'subject_exhausted')).toHaveLength(45);
    expect(await metric('subjectsCreated')).toEqual([{ policy: 'api', value: 1 }]);
    // The cap's second creation is still there for another new subject, and then it is used up.
    expect((await decide({ policy: 'api', subject: 'other' })).body.allowed).toBe(true);
    expect((await decide({ policy: 'api', subject: 'third' })).body.results[0]?.reason).toBe('subject_flood');
    expect(takes).toBe(3);
  });

  it('a creation call that fails fails every decision that waited for it, and the next one asks afresh', async () => {
    const { decide, store } = agent({ newSubjects: { perMinute: 2 } });
    const take = store.takeCreation.bind(store);
    let fail = true;
    store.takeCreation = async (request) => {
      await new Promise((r) => setTimeout(r, 5));
      if (fail) throw new Error('ECONNRESET');
      return take(request);
    };
    const failed = await Promise.all(
      Array.from({ length: 3 }, () => decide({ policy: 'api', subject: 'x' })),
    );
    // The policy's failure mode (closed by default) answers each: nothing was created.
    expect(failed.map((r) => [r.body.allowed, r.body.results[0]?.reason])).toEqual(
      Array.from({ length: 3 }, () => [false, 'store_unavailable']),
    );
    fail = false;
    expect((await decide({ policy: 'api', subject: 'x' })).body.allowed).toBe(true);
  });
});
