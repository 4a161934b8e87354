/**
 * `POST /v1/terms` (regional-agent/terms/): what a term says, who gets one, what it holds and for how long.
 */
import { createHash } from 'node:crypto';
import { pino } from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { RegionalShare, ShareView } from '../../../../core/shares/shares.js';
import { DEFAULT_RATE_LIMIT_DRAFT } from '../../../../core/wire/rate-limit-headers.js';
import { MAX_TERM_USAGE, termKeyFingerprint } from '../../../../core/wire/term.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';
import type { ShortfallHandler } from '../../../../regional-agent/decisions/decision-service.js';
import { buildApp, type AgentDeps } from '../../../../regional-agent/app.js';
import { decisionRoute } from '../../../../regional-agent/http/admission-hook.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { AgentMetrics } from '../../../../regional-agent/observability/metrics.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import { luaSource } from '../../../../regional-agent/redis/scripts.js';
import { TermHolds } from '../../../../regional-agent/terms/term-holds.js';
import { issueTerm, type TermIssuerOptions } from '../../../../regional-agent/terms/term-issuer.js';

const OFFSET = 1_000_000;
const SHA = createHash('sha1').update(luaSource('token_bucket')).digest('hex');
const REFUND_SHA = createHash('sha1').update(luaSource('refund')).digest('hex');

const hot = parsePolicy({ name: 'hot', capacity: 100, refillPerSecond: 0.5 });
const gold = { gold: { capacity: 50, refillPerSecond: 5 } };
const policies = [
  hot,
  parsePolicy({ name: 'log', kind: 'sliding_log', capacity: 5, windowSeconds: 60 }),
  parsePolicy({ name: 'strict', capacity: 100, refillPerSecond: 1, mode: 'strict', homeRegion: 'us' }),
  parsePolicy({ name: 'sharded', capacity: 100, refillPerSecond: 1, shards: 4 }),
  parsePolicy({ name: 'capped', capacity: 10, refillPerSecond: 1, newSubjects: { perMinute: 5 } }),
  parsePolicy({ name: 'byip', capacity: 10, refillPerSecond: 1, subjectKind: 'ip' }),
  parsePolicy({
    name: 'classed',
    capacity: 10,
    refillPerSecond: 1,
    classes: gold,
    subjects: { vip: 'gold' },
  }),
  parsePolicy({
    name: 'crowded',
    capacity: 10,
    refillPerSecond: 1,
    classes: gold,
    subjects: Object.fromEntries(Array.from({ length: 1025 }, (_, i) => [`s${i}`, 'gold'])),
  }),
  parsePolicy({ name: 'nearby', capacity: 10, refillPerSecond: 1, mode: 'local' }),
];

/** A share view that counts what enters and leaves, with a share, a stability and overrides the test sets. */
class CountingShares implements ShareView {
  entered = 0;
  left = 0;
  share: RegionalShare | undefined = { share: 1, epoch: 0 };
  stable = Infinity;
  overrides: string[] = [];
  shareFor(): RegionalShare | undefined {
    return this.share;
  }
  defaultShare(): RegionalShare | undefined {
    return this.share;
  }
  stableForMs(): number {
    return this.stable;
  }
  overrideSubjects(): readonly string[] {
    return this.overrides;
  }
  enter(): () => void {
    this.entered++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.left++;
    };
  }
}

type Recorded = [string, string, number, boolean, number, number];

function agent(
  options: {
    shares?: ShareView;
    config?: Record<string, unknown>;
    deps?: Partial<AgentDeps>;
    noRedisClock?: boolean;
    noTermsUntil?: boolean;
  } = {},
) {
  const clock = new ManualClock(1_750_000_000_000);
  const usage: Recorded[] = [];
  /** The instants each term asked to be recorded, in order. */
  const covered: number[] = [];
  const shares = options.shares ?? new CountingShares();
  const built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource(policies),
      shares,
      log: pino({ level: 'silent' }),
      clock,
      random: () => 0,
      ...(options.noRedisClock === true
        ? {}
        : {
            redisClock: {
              toRedisMicros: (m: number) => m + OFFSET,
              toRedisMicrosNewest: (m: number) => m + OFFSET,
            },
          }),
      usage: { record: (...args) => void usage.push(args) },
      ...(options.noTermsUntil === true
        ? {}
        : { termsUntil: { cover: (until: number) => Promise.resolve(void covered.push(until)) } }),
      ...options.deps,
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: 'redis://127.0.0.1:1',
      policiesFile: 'unused',
      reservationSweepMs: 0,
      terms: 'on',
      termMs: 300,
      ...options.config,
    }),
  );
  const post = async (payload: unknown) => {
    await built.ready;
    const res = await built.app.inject({
      method: 'POST',
      url: '/v1/terms',
      headers: { 'content-type': 'application/json' },
      payload: typeof payload === 'string' ? payload : JSON.stringify(payload),
    });
    return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
  };
  const metric = async (line: RegExp) => {
    const text = (await built.app.inject({ method: 'GET', url: '/metrics' })).body;
    return Number(line.exec(text)?.[1] ?? 0);
  };
  return { post, metric, built, usage, shares, covered };
}

/** The problem an answer carries: its status, its code, and whether its detail names `detail`. */
const problem = (answer: { status: number; body: Record<string, unknown> }, detail: string) => ({
  status: answer.status,
  code: answer.body['code'],
  names: String(answer.body['detail']).includes(detail),
});
const notAllowed = { status: 400, code: 'AGT_ERR_TERM_NOT_ALLOWED', names: true };
const unavailable = { status: 503, code: 'AGT_ERR_TERM_UNAVAILABLE', names: true };

describe('POST /v1/terms: the term', () => {
  it("a token bucket's term: sized as a subject with no override, the agent's script, a deadline in Redis time", async () => {
    const { post, metric, shares, covered } = agent();
    const before = Math.floor((performance.timeOrigin + performance.now()) * 1000);
    const term = await post({ policy: 'hot' });
    const after = Math.floor((performance.timeOrigin + performance.now()) * 1000);
    const { deadlineMicros: deadline, ...rest } = term.body;
    expect(term.status).toBe(200);
    expect(rest).toEqual({
      policy: 'hot',
      version: 1,
      epoch: 0,
      bucket: { capacity: 100, refillPerSecond: 0.5, ttlMs: hot.idleTtlSeconds * 1000 },
      limit: 100,
      window: 200,
      mode: 'regional',
      validForMs: 300,
      maxCost: hot.maxCost,
      // The whole policy's capacity in this region: a refusal is the subject's own budget.
      refusedReason: 'subject_exhausted',
      refusals: 'final',
      exclude: [],
      headers: { draft: DEFAULT_RATE_LIMIT_DRAFT, legacy: false },
      scriptSha: SHA,
      refundSha: REFUND_SHA,
    });
    expect(deadline).toBeGreaterThanOrEqual(before + 300_000 + OFFSET);
    expect(deadline).toBeLessThanOrEqual(after + 300_000 + OFFSET);
    // The term alone (no restart hold without a coordinator), its end recorded with the margin first.
    expect(shares).toMatchObject({ entered: 1, left: 0 });
    expect(covered).toEqual([(deadline as number) + 20_000]);
    expect(await metric(/quotaplane_terms_total\{[^}]*policy="hot"[^}]*outcome="issued"[^}]*\} (\S+)/)).toBe(
      1,
    );
    expect(await metric(/^quotaplane_terms_held (\S+)$/m)).toBe(1);
  });

  it('is admitted like the other routes that reach the decision path (route label terms)', () => {
    expect(decisionRoute('/v1/terms')).toBe('terms');
  });

  it('sends the script source only when asked; its SHA1 is the scriptSha', async () => {
    const { post } = agent();
    const asked = await post({ policy: 'hot', script: true });
    expect(asked.body['script']).toBe(luaSource('token_bucket'));
    expect(
      createHash('sha1')
        .update(asked.body['script'] as string)
        .digest('hex'),
    ).toBe(asked.body['scriptSha']);
    expect((await post({ policy: 'hot', script: false })).body).not.toHaveProperty('script');
  });

  it('names the refund script for tokens taken ahead, and sends its source only when asked', async () => {
    const { post } = agent();
    const asked = await post({ policy: 'hot', script: true });
    expect(asked.body['refundScript']).toBe(luaSource('refund'));
    expect(
      createHash('sha1')
        .update(asked.body['refundScript'] as string)
        .digest('hex'),
    ).toBe(asked.body['refundSha']);
    const plain = (await post({ policy: 'hot' })).body;
    expect(plain['refundSha']).toBe(asked.body['refundSha']);
    expect(plain).not.toHaveProperty('refundScript');
  });

  it("sizes by the share in force with its floor and epoch; headers as the agent's; a local policy is whole", async () => {
    const shares = new CountingShares();
    shares.share = { share: 0.25, epoch: 7, lowest: 0.1 };
    const { post } = agent({ shares, config: { legacyHeaders: true, rateLimitHeaders: 'draft-10' } });
    const term = await post({ policy: 'hot' });
    expect(term.body).toMatchObject({
      epoch: 7,
      bucket: {
        capacity: 25,
        refillPerSecond: 0.125,
        floor: { beforeMicros: 1, capacity: 10, refillPerSecond: 0.05 },
      },
      limit: 25,
      headers: { draft: 'draft-10', legacy: true },
    });
    const local = await post({ policy: 'nearby' });
    expect(local.body).toMatchObject({
      mode: 'local',
      epoch: 0,
      bucket: { capacity: 10, refillPerSecond: 1 },
    });
  });

  it('excludes override subjects and subjects the policy names a class for', async () => {
    const shares = new CountingShares();
    shares.overrides = ['big', 'vip'];
    const { post } = agent({ shares });
    expect((await post({ policy: 'classed' })).body['exclude']).toEqual(['big', 'vip']);
    expect((await post({ policy: 'hot' })).body['exclude']).toEqual(['big', 'vip']);
  });

  it("refusals go to the agent when it borrows for a regional policy (with the policy's budget), else final", async () => {
    const shortfall: ShortfallHandler = { cover: () => Promise.resolve({ covered: false, reasons: [] }) };
    const { post } = agent({ deps: { shortfall } });
    expect((await post({ policy: 'hot' })).body).toMatchObject({
      refusals: 'agent',
      budget: { capacity: 100, refillPerSecond: 0.5 },
    });
    const local = await post({ policy: 'nearby' });
    expect(local.body['refusals']).toBe('final');
    expect(local.body).not.toHaveProperty('budget');
  });
});

describe('POST /v1/terms: who gets none', () => {
  it('refuses each policy that gives none, saying why; counts it', async () => {
    const { post, metric, shares } = agent();
    expect(problem(await post({ policy: 'log' }), 'sliding log policy')).toEqual(notAllowed);
    expect(problem(await post({ policy: 'strict' }), 'strict')).toEqual(notAllowed);
    expect(problem(await post({ policy: 'sharded' }), 'sharded')).toEqual(notAllowed);
    expect(problem(await post({ policy: 'capped' }), 'subject-creation cap')).toEqual(notAllowed);
    expect(problem(await post({ policy: 'byip' }), 'ip policy')).toEqual(notAllowed);
    expect(problem(await post({ policy: 'crowded' }), '1025 subjects are decided apart')).toEqual(notAllowed);
    expect(shares).toMatchObject({ entered: 0 });
    expect(
      await metric(/quotaplane_terms_total\{[^}]*policy="log"[^}]*outcome="not_allowed"[^}]*\} (\S+)/),
    ).toBe(1);
  });

  it("an agent that hashes subjects names its secret's fingerprint, never the secret; usage subjects are hashed", async () => {
    const secret = 'a-secret-of-16-chars-or-more';
    const { post, usage } = agent({ config: { hmacSecret: secret } });
    const term = await post({ policy: 'hot', usage: [['tenant-1', 2, 0]] });
    expect(term.status).toBe(200);
    expect(term.body['hashed']).toEqual({ fingerprint: termKeyFingerprint(secret) });
    expect(JSON.stringify(term.body)).not.toContain(secret);
    expect(usage.map((u) => u[1])).toEqual([
      (normalizeSubject('tenant-1', { hmacSecret: secret }) as { subject: string }).subject,
    ]);
  });

  it('QP_TERMS=off: 404 AGT_ERR_TERMS_OFF, whatever the body', async () => {
    const { post } = agent({ config: { terms: 'off' } });
    expect(await post({ policy: 'hot' })).toMatchObject({ status: 404, body: { code: 'AGT_ERR_TERMS_OFF' } });
    expect(await post({ nonsense: 1 })).toMatchObject({ status: 404, body: { code: 'AGT_ERR_TERMS_OFF' } });
  });

  it('unknown policies, prototype names included: 404 AGT_ERR_UNKNOWN_POLICY', async () => {
    const { post, shares } = agent();
    for (const policy of ['nope', '__proto__', 'constructor', 'toString', 'hasOwnProperty']) {
      expect(await post({ policy }), policy).toMatchObject({
        status: 404,
        body: { code: 'AGT_ERR_UNKNOWN_POLICY' },
      });
    }
    expect(shares).toMatchObject({ entered: 0 });
  });

  it('malformed bodies: 400 AGT_ERR_INVALID_TERM, nothing counted or held', async () => {
    const { post, usage, shares } = agent();
    const bodies: unknown[] = [
      {},
      [],
      '"hot"',
      null,
      { policy: ['hot'] },
      { policy: { name: 'hot' } },
      { policy: '' },
      { policy: 'hot', extra: 1 },
      { policy: 'hot', script: 'yes' },
      { policy: 'hot', usage: {} },
      { policy: 'hot', usage: [['a', 1]] },
      { policy: 'hot', usage: [['a', -1, 0]] },
      { policy: 'hot', usage: [['a', 1.5, 0]] },
      { policy: 'hot', usage: [[['a'], 1, 0]] },
      { policy: 'hot', usage: [[{ a: 1 }, 1, 0]] },
      { policy: 'hot', usage: Array.from({ length: MAX_TERM_USAGE + 1 }, () => ['a', 1, 0]) },
      // More admitted than one term of `hot` admits: a full bucket (100), a tenth of it held taken ahead (10) and
      // 2 s of its refill (0.5/s), 111.
      {
        policy: 'hot',
        usage: [
          ['a', 112, 0],
          ['b', 113, 0],
        ],
      },
      { policy: 'hot', usage: [['a', 1e9, 1]] },
    ];
    for (const body of bodies) {
      expect(await post(body), JSON.stringify(body)).toMatchObject({
        status: 400,
        body: { code: 'AGT_ERR_INVALID_TERM' },
      });
    }
    // A `__proto__` key (an own key once parsed): refused before the body reaches the route.
    const proto = await post('{"policy":"hot","usage":[["a",1,0]],"__proto__":{"script":true}}');
    expect(proto.status).toBe(400);
    expect(usage).toEqual([]);
    expect(shares).toMatchObject({ entered: 0 });
  });
});

describe('POST /v1/terms: usage of the last term', () => {
  it("each subject's admitted and refused tokens are counted as the decision path counts its own", async () => {
    const { post, usage, metric } = agent();
    const term = await post({
      policy: 'hot',
      usage: [
        ['a', 5, 0],
        ['b', 3, 2],
        ['c', 0, 4],
      ],
    });
    expect(term.status).toBe(200);
    expect(usage).toEqual([
      ['hot', 'a', 5, true, 1, 0.5],
      ['hot', 'b', 3, true, 0, 0.5],
      ['hot', 'b', 2, false, 0, 0.5],
      ['hot', 'c', 4, false, 0, 0.5],
    ]);
    const tokens = (outcome: string) =>
      metric(
        new RegExp(
          `quotaplane_direct_decision_tokens_total\\{[^}]*policy="hot"[^}]*outcome="${outcome}"[^}]*\\} (\\S+)`,
        ),
      );
    expect(await tokens('admitted')).toBe(8);
    expect(await tokens('refused')).toBe(6);
  });

  it("a subject the policy names a class for is counted at its class's rate; a local policy reports no usage", async () => {
    const { post, usage } = agent();
    await post({ policy: 'classed', usage: [['vip', 1, 0]] });
    await post({ policy: 'nearby', usage: [['a', 1, 0]] });
    expect(usage).toEqual([['classed', 'vip', 1, true, 1, 5]]);
  });

  it('admitted tokens may include those a client held taken ahead: a tenth of the bucket more than one term admits', async () => {
    // A client admits, within one report, tokens it took ahead earlier (at most a tenth of its bucket) and what the
    // bucket paid meanwhile: for `hot` (100, 0.5/s) a full bucket, 10 held and 2 s of refill, 111. One more is not
    // a report but an attempt to pull demand.
    const { post, usage } = agent();
    expect(await post({ policy: 'hot', usage: [['a', 111, 0]] })).toMatchObject({ status: 200 });
    expect(usage).toEqual([['hot', 'a', 111, true, 1, 0.5]]);
    const refused = await post({ policy: 'hot', usage: [['a', 112, 0]] });
    expect(refused).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_TERM' } });
    expect(String(refused.body['detail'])).toContain('(111)');
    expect(usage).toHaveLength(1);
  });

  it('an invalid subject refuses the whole request: 400 AGT_ERR_INVALID_SUBJECT, nothing counted', async () => {
    const { post, usage, metric } = agent();
    const refused = await post({
      policy: 'hot',
      usage: [
        ['fine', 1, 0],
        ['not fine', 1, 0],
        ['h.looks-hashed', 1, 0],
      ],
    });
    expect(refused).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_SUBJECT' } });
    expect(refused.body['errors']).toHaveLength(2);
    expect(usage).toEqual([]);
    expect(await metric(/quotaplane_direct_decision_tokens_total\{[^}]*\} (\S+)/)).toBe(0);
  });
});

describe('POST /v1/terms: none now (503 AGT_ERR_TERM_UNAVAILABLE)', () => {
  it('no lease, a lease about to end, no Redis clock or no sample: no term, nothing held', async () => {
    const shares = new CountingShares();
    const { post, metric } = agent({ shares });
    shares.share = undefined;
    expect(problem(await post({ policy: 'hot' }), 'no_lease')).toEqual(unavailable);
    shares.share = { share: 1, epoch: 0 };
    shares.stable = 199;
    expect(problem(await post({ policy: 'hot' }), 'ending sooner than the shortest term')).toEqual(
      unavailable,
    );
    shares.stable = 200;
    expect((await post({ policy: 'hot' })).body['validForMs']).toBe(200);
    shares.stable = 250.9;
    expect((await post({ policy: 'hot' })).body['validForMs']).toBe(250);
    expect(shares.entered).toBe(2);
    expect(await metric(/quotaplane_terms_total\{[^}]*outcome="unavailable"[^}]*\} (\S+)/)).toBe(2);

    const unsynced = agent({
      deps: { redisClock: { toRedisMicros: () => 0, toRedisMicrosNewest: () => 0 } },
    });
    expect(problem(await unsynced.post({ policy: 'hot' }), 'no Redis TIME sample')).toEqual(unavailable);
    const clockless = agent({ noRedisClock: true });
    expect(problem(await clockless.post({ policy: 'hot' }), 'no Redis TIME sample')).toEqual(unavailable);
    expect(unsynced.shares).toMatchObject({ entered: 0 });
  });

  it('a term is answered only once its end is recorded; a failed record refuses it and changes nothing', async () => {
    let fail = false;
    let finish!: () => void;
    const pending: Promise<void>[] = [];
    const shares = new CountingShares();
    const { post, metric } = agent({
      shares,
      deps: {
        termsUntil: {
          cover: () => {
            if (fail) return Promise.reject(new Error('READONLY'));
            const p = new Promise<void>((resolve) => (finish = resolve));
            pending.push(p);
            return p;
          },
        },
      },
    });
    let answered = false;
    const asked = post({ policy: 'hot' }).then((a) => ((answered = true), a));
    while (pending.length === 0) await new Promise((r) => setTimeout(r, 1));
    await new Promise((r) => setTimeout(r, 10));
    // Held already (a shrink acknowledged meanwhile must wait for it), not answered.
    expect(answered).toBe(false);
    expect(shares).toMatchObject({ entered: 1, left: 0 });
    finish();
    expect((await asked).status).toBe(200);

    fail = true;
    expect(problem(await post({ policy: 'hot' }), 'could not be recorded in Redis')).toEqual(unavailable);
    // The refused term's hold was left at once; the first term's is still held.
    expect(shares).toMatchObject({ entered: 2, left: 1 });
    expect(await metric(/^quotaplane_terms_held (\S+)$/m)).toBe(1);
    expect(await metric(/quotaplane_terms_total\{[^}]*outcome="issued"[^}]*\} (\S+)/)).toBe(1);
    expect(await metric(/quotaplane_terms_total\{[^}]*outcome="unavailable"[^}]*\} (\S+)/)).toBe(1);
  });

  it('an agent with nowhere to record its terms gives none', async () => {
    const shares = new CountingShares();
    const { post } = agent({ shares, noTermsUntil: true });
    expect(problem(await post({ policy: 'hot' }), 'cannot record its terms')).toEqual(unavailable);
    expect(shares).toMatchObject({ entered: 0 });
  });

  it('a share view that cannot bound a term gives none', async () => {
    const bare: ShareView = { shareFor: () => ({ share: 1, epoch: 0 }), enter: () => () => undefined };
    const { post } = agent({ shares: bare });
    expect(problem(await post({ policy: 'hot' }), 'cannot bound')).toEqual(unavailable);
  });
});

describe('term holds', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  function issuer(shares: CountingShares, holds = new TermHolds({ waitOnClose: true })) {
    const options: TermIssuerOptions = {
      policies: new StaticPolicySource(policies),
      shares,
      holds,
      metrics: new AgentMetrics({ region: 'us', processMetrics: false }),
      redisClock: { toRedisMicrosNewest: (m) => m + OFFSET },
      usage: undefined,
      borrows: false,
      terms: 'on',
      termMs: 1000,
      hmacSecret: undefined,
      legacyHeaders: false,
      rateLimitDraft: undefined,
      termsUntil: { cover: () => Promise.resolve() },
      micros: () => 5_000_000,
    };
    return { issue: () => issueTerm(options, { policy: 'hot' }), holds };
  }

  it('a term is left validForMs + 20 ms after it was given, not before', async () => {
    vi.useFakeTimers();
    const shares = new CountingShares();
    const { issue, holds } = issuer(shares);
    expect(await issue()).toMatchObject({ validForMs: 1000, deadlineMicros: 5_000_000 + 1_000_000 + OFFSET });
    expect(shares).toMatchObject({ entered: 1, left: 0 });
    expect(holds.held).toBe(1);
    vi.advanceTimersByTime(1019);
    expect(shares.left).toBe(0);
    vi.advanceTimersByTime(1);
    expect(shares.left).toBe(1);
    expect(holds.held).toBe(0);
  });

  it('validity is bounded by how long the share is sure to hold, and so is the hold', async () => {
    vi.useFakeTimers();
    const shares = new CountingShares();
    shares.stable = 450;
    const { issue } = issuer(shares);
    expect(await issue()).toMatchObject({ validForMs: 450, deadlineMicros: 5_000_000 + 450_000 + OFFSET });
    vi.advanceTimersByTime(469);
    expect(shares.left).toBe(0);
    vi.advanceTimersByTime(1);
    expect(shares.left).toBe(1);
  });

  it('closing (with a coordinator) waits for every term to run out, leaving none early; then gives none', async () => {
    vi.useFakeTimers();
    const shares = new CountingShares();
    const { issue, holds } = issuer(shares);
    await issue();
    let closed = false;
    const closing = holds.close().then(() => (closed = true));
    await vi.advanceTimersByTimeAsync(1019);
    expect(closed).toBe(false);
    expect(shares.left).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    await closing;
    expect(shares.left).toBe(1);
    await expect(issue()).rejects.toThrow(/shutting down/);
  });

  it('closing without a coordinator clears the holds and leaves nothing', async () => {
    vi.useFakeTimers();
    const shares = new CountingShares();
    const { issue, holds } = issuer(shares, new TermHolds({ waitOnClose: false }));
    await issue();
    await holds.close();
    expect(holds.held).toBe(0);
    vi.advanceTimersByTime(10_000);
    expect(shares.left).toBe(0);
  });

  it('without a coordinator nothing is held at start, terms on or off', async () => {
    for (const terms of ['on', 'off']) {
      const shares = new CountingShares();
      const { built, metric } = agent({ shares, config: { terms, termMs: 300 } });
      await built.ready;
      expect(shares, terms).toMatchObject({ entered: 0, left: 0 });
      expect(await metric(/^quotaplane_terms_held (\S+)$/m), terms).toBe(0);
      await built.close();
    }
  });

  it("the coordinator's restart hold is held until the predecessor's terms are over, terms on or off; closing waits for it", async () => {
    for (const terms of ['on', 'off']) {
      const shares = new CountingShares();
      let left = 0;
      let over!: () => void;
      const restartHold = { leave: () => void left++, over: new Promise<void>((r) => (over = r)) };
      const { built, metric } = agent({ shares, config: { terms }, deps: { restartHold } });
      await built.ready;
      expect(shares.entered, terms).toBe(0);
      expect(await metric(/^quotaplane_terms_held (\S+)$/m), terms).toBe(1);
      let closed = false;
      const closing = built.close().then(() => (closed = true));
      await new Promise((r) => setTimeout(r, 20));
      expect({ left, closed }, terms).toEqual({ left: 0, closed: false });
      over();
      await closing;
      expect(left, terms).toBe(1);
    }
  });

  it('a release leaves a hold at once, once; a hold until a promise leaves when it settles, rejected or not', async () => {
    const holds = new TermHolds({ waitOnClose: true });
    let left = 0;
    const release = holds.hold(() => void left++, 60_000);
    let fail!: (e: Error) => void;
    holds.holdUntil(() => void left++, new Promise((_, reject) => (fail = reject)));
    expect(holds.held).toBe(2);
    release();
    release();
    expect({ left, held: holds.held }).toEqual({ left: 1, held: 1 });
    const closing = holds.close();
    fail(new Error('read failed'));
    await closing;
    expect({ left, held: holds.held }).toEqual({ left: 2, held: 0 });
  });
});
