import type { Tracer } from '@opentelemetry/api';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse, type CheckResult } from '../../../../core/wire/agent.js';
import type { DecideRequest, Decision } from '../../../../core/wire/bucket.js';
import { ManualClock } from '../../../../core/clock.js';
import { MAX_LEASE_TOKEN_LENGTH } from '../../../../core/concurrency.js';
import { bucketKey } from '../../../../core/keys.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';
import { parsePolicy, type PolicyInput } from '../../../../core/policy/policy.js';
import { StaticShareView, type RegionalShare, type ShareView } from '../../../../core/shares/shares.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import type { DecisionStore } from '../../../../regional-agent/decisions/decision-store.js';
import {
  HomeOverloadedError,
  type Forwarder,
  type ForwardRequest,
} from '../../../../regional-agent/decisions/forwarder.js';
import type { ShortfallHandler } from '../../../../regional-agent/decisions/borrowing-port.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import { UsageRecorder } from '../../../../regional-agent/reporting/usage-recorder.js';
import { onTheWire } from '../../../../regional-agent/resilience/wire-timeout.js';

const clock = new ManualClock(1_750_000_000_000);

const policy = (name: string, over: Partial<PolicyInput> = {}) =>
  parsePolicy({ name, capacity: 10, refillPerSecond: 1, maxCost: 10, ...over });

const policies = [
  policy('closed'),
  policy('open', { onStoreFailure: 'open' }),
  policy('local', { onStoreFailure: 'local', capacity: 100 }),
  policy('home', { mode: 'strict', homeRegion: 'us' }),
  policy('away', { mode: 'strict', homeRegion: 'eu' }),
  policy('far', { mode: 'strict', homeRegion: 'ap' }),
  policy('everywhere', { mode: 'local' }),
  parsePolicy({ name: 'day-closed', kind: 'daily', capacity: 100 }),
  policy('tiered', {
    capacity: 2,
    maxCost: 1,
    classes: { enterprise: { capacity: 5, refillPerSecond: 10 } },
    subjects: { 'tenant-e': 'enterprise' },
  }),
];

/** A ShareView that records entries and exits, with a table of shares (undefined: no lease). */
class RecordingShares implements ShareView {
  entered = 0;
  left = 0;
  constructor(readonly table: Record<string, RegionalShare | undefined>) {}
  shareFor(p: string): RegionalShare | undefined {
    return p in this.table ? this.table[p] : { share: 1, epoch: 1 };
  }
  enter(): () => void {
    this.entered++;
    return () => this.left++;
  }
}

/** A store that fails or hangs on demand, around the model store. */
class FlakyStore implements DecisionStore {
  readonly inner = new ModelDecisionStore(clock);
  mode: 'ok' | 'fail' | 'hang' = 'ok';
  calls: DecideRequest[] = [];
  decide(request: DecideRequest): Promise<Decision> {
    this.calls.push(request);
    if (this.mode === 'fail') return Promise.reject(new Error('ECONNREFUSED'));
    // A reply that never arrives: the store times the call on the wire, as the Redis store does.
    if (this.mode === 'hang') return onTheWire(new Promise<Decision>(() => undefined), 40, 'decide');
    return this.inner.decide(request);
  }
  slotOf(key: string) {
    return this.inner.slotOf(key);
  }
  refund(...a: Parameters<DecisionStore['refund']>) {
    return this.inner.refund(...a);
  }
  claim(...a: Parameters<DecisionStore['claim']>) {
    return this.inner.claim(...a);
  }
  decideLog(...a: Parameters<DecisionStore['decideLog']>) {
    if (this.mode === 'fail') return Promise.reject(new Error('ECONNREFUSED'));
    return this.inner.decideLog(...a);
  }
  refundLog(...a: Parameters<DecisionStore['refundLog']>) {
    return this.inner.refundLog(...a);
  }
  takeCreation(...a: Parameters<DecisionStore['takeCreation']>) {
    return this.inner.takeCreation(...a);
  }
  decideDay(...a: Parameters<DecisionStore['decideDay']>) {
    if (this.mode === 'fail') return Promise.reject(new Error('ECONNREFUSED'));
    return this.inner.decideDay(...a);
  }
  refundDay(...a: Parameters<DecisionStore['refundDay']>) {
    return this.inner.refundDay(...a);
  }
}

function agent(
  options: {
    shares?: ShareView;
    store?: DecisionStore;
    forwarder?: Forwarder;
    shortfall?: ShortfallHandler;
    usage?: UsageRecorder;
  } = {},
) {
  const built = buildApp(
    {
      store: options.store ?? new ModelDecisionStore(clock),
      policies: new StaticPolicySource(policies),
      shares: options.shares ?? new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      random: () => 1,
      ...(options.forwarder ? { forwarder: options.forwarder } : {}),
      ...(options.shortfall ? { shortfall: options.shortfall } : {}),
      ...(options.usage ? { usage: options.usage } : {}),
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: 'redis://127.0.0.1:1',
      policiesFile: 'unused',
      decisionDeadlineMs: 40,
      breakerVolumeThreshold: 1000,
    }),
  );
  const decide = async (body: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
    return { status: res.statusCode, body: res.json<unknown>() };
  };
  const decision = async (body: object) => {
    const r = await decide(body);
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    return DecisionResponse.parse(r.body);
  };
  /** The decision before the HTTP answer floors its tokens: the exact values the buckets hold. */
  const exact = async (body: object) => {
    await built.ready;
    return built.service.decideBody(body, 'exact');
  };
  return { built, decide, decision, exact };
}

describe('sizing buckets from the ShareView', () => {
  it('enforces capacity × share and refill × share', async () => {
    const { decision, exact } = agent({ shares: new StaticShareView({ closed: 0.3 }) });
    const d = await decision({ policy: 'closed', subject: 's1', cost: 3 });
    expect(d.results[0]).toMatchObject({ allowed: true, remaining: 0, limit: 3, resetMs: 10_000 });
    clock.advance(3333);
    const again = await exact({ policy: 'closed', subject: 's1' });
    expect(again.results[0]).toMatchObject({ allowed: false, retryAfterMs: 1, remaining: 0.9999 });
    // The answer floors it: 0.9999 tokens admit nothing of cost 1.
    const wire = await decision({ policy: 'closed', subject: 's1' });
    expect(wire.results[0]).toMatchObject({ allowed: false, retryAfterMs: 1, remaining: 0, limit: 3 });
  });

  it('passes a share floor to the script: an idle bucket refills at the lowest share since the dip', async () => {
    const since = clock.now();
    const shares = new RecordingShares({
      closed: { share: 1, epoch: 3, floor: { sinceMs: since + 1, share: 0.1 } },
    });
    const { decision, exact } = agent({ shares });
    const subject = 'floored';
    await decision({ policy: 'closed', subject, cost: 10 });
    clock.advance(5000);
    // At share 1 the bucket would hold 5; written before the floor instant, it refilled at 0.1/s: 0.5.
    const d = await exact({ policy: 'closed', subject, dryRun: true });
    expect(d.results[0]!.remaining).toBeCloseTo(0.5, 6);
  });

  it('says cost_exceeds_share when the share is too small for the cost, instead of denying in silence', async () => {
    const { decision, exact } = agent({ shares: new StaticShareView({ closed: 0.05 }) });
    expect((await exact({ policy: 'closed', subject: 'tiny', dryRun: true })).results[0]!.limit).toBe(0.5);
    const d = await decision({ policy: 'closed', subject: 'tiny' });
    expect(d.allowed).toBe(false);
    expect(d.retryAfterMs).toBeNull();
    expect(d.results[0]).toMatchObject({ reason: 'cost_exceeds_share', retryAfterMs: null, limit: 0 });
    expect(d.headers['Retry-After']).toBeUndefined();
  });

  it('applies the failure mode with reason no_lease when this region holds no share', async () => {
    const shares = new RecordingShares({ closed: undefined, open: undefined, local: undefined });
    const { decision } = agent({ shares });
    expect((await decision({ policy: 'closed', subject: 'x' })).results[0]).toMatchObject({
      allowed: false,
      reason: 'no_lease',
    });
    expect((await decision({ policy: 'open', subject: 'x' })).results[0]).toMatchObject({
      allowed: true,
      reason: 'fail_open',
      cause: 'no_lease',
    });
    // Without a share there is nothing to size an emergency bucket from: local fails closed.
    expect((await decision({ policy: 'local', subject: 'x' })).results[0]).toMatchObject({
      allowed: false,
      reason: 'no_lease',
    });
  });

  it('enters every policy before deciding and leaves after, even when the store fails', async () => {
    const shares = new RecordingShares({});
    const store = new FlakyStore();
    const { decision } = agent({ shares, store });
    await decision({
      checks: [
        { policy: 'closed', subject: 'a' },
        { policy: 'open', subject: 'a' },
      ],
    });
    store.mode = 'fail';
    await decision({ policy: 'closed', subject: 'a' });
    // Nothing else entered: without a coordinator there is no restart hold.
    expect(shares.entered).toBe(3);
    expect(shares.left).toBe(3);
  });

  it('local mode and strict-at-home use the whole budget whatever the share', async () => {
    const { decision } = agent({ shares: new StaticShareView({}, 0.1) });
    expect((await decision({ policy: 'everywhere', subject: 'a' })).results[0]).toMatchObject({
      limit: 10,
      mode: 'local',
    });
    expect((await decision({ policy: 'home', subject: 'a' })).results[0]).toMatchObject({
      limit: 10,
      mode: 'strict',
    });
    expect((await decision({ policy: 'closed', subject: 'a' })).results[0]).toMatchObject({ limit: 1 });
  });
});

describe('usage the coordinator follows', () => {
  it("caps each subject's refused demand at its class's rate, the default subject's at the policy's", async () => {
    // The policy's R is 1/s; its enterprise class refills at 10/s. Each subject asks 40 at one instant.
    const usage = new UsageRecorder(clock.now(), { limitPerSecond: () => 1 });
    const { decision } = agent({ usage });
    const check = (subject: string) => ({ checks: [{ policy: 'tiered', subject }] });
    let admitted = 0;
    for (let i = 0; i < 40; i++) if ((await decision(check('tenant-e'))).allowed) admitted++;
    for (let i = 0; i < 40; i++) if ((await decision(check('tenant-d'))).allowed) admitted++;
    for (let i = 0; i < 40; i++)
      if (
        (await decision({ checks: [{ policy: 'tiered', subject: 'tenant-c', class: 'enterprise' }] })).allowed
      )
        admitted++;
    expect(admitted).toBe(5 + 2 + 5); // each bucket's capacity
    const [tiered] = usage.take(clock.now() + 1000).chunks[0]!;
    // tenant-e and tenant-c (enterprise): max(5 admitted, 10/s × 1 s) = 10 each; tenant-d: max(2, 1) = 2.
    expect([tiered!.requested, tiered!.admitted, tiered!.demand]).toEqual([120, 12, 10 + 10 + 2]);
  });
});

describe('a refusal for lack of local tokens', () => {
  it('is offered to the shortfall handler, and decided once more when it brought tokens', async () => {
    const store = new ModelDecisionStore(clock);
    const offered: string[][] = [];
    let give = 2;
    const shortfall: ShortfallHandler = {
      async cover(short) {
        offered.push(short.map((s) => s.check.policy.name));
        if (give === 0) return { covered: false, reasons: short.map(() => 'subject_exhausted' as const) };
        await store.refund({
          checks: short.map((s) => ({
            key: s.check.bucket.key,
            cost: give,
            capacity: s.check.bucket.capacity,
          })),
        });
        give = 0;
        return { covered: true, reasons: short.map(() => undefined) };
      },
    };
    const { decision } = agent({ store, shortfall });
    expect((await decision({ policy: 'closed', subject: 'short', cost: 10 })).allowed).toBe(true);
    expect(offered).toEqual([]);
    const covered = await decision({ policy: 'closed', subject: 'short', cost: 2 });
    expect(covered.allowed).toBe(true);
    expect(covered.results[0]).toMatchObject({ remaining: 0 });
    const refused = await decision({ policy: 'closed', subject: 'short', cost: 2 });
    expect(refused.allowed).toBe(false);
    expect(refused.results[0]).toMatchObject({ reason: 'subject_exhausted' });
    expect(offered).toEqual([['closed'], ['closed']]);
    // A dry run and a check that can never fit are not offered.
    await decision({ policy: 'closed', subject: 'short', dryRun: true });
    await decision({ policy: 'everywhere', subject: 'short', cost: 10 });
    await decision({ policy: 'everywhere', subject: 'short', cost: 10 });
    expect(offered).toHaveLength(2);
  });
});

describe('strict mode: the Forwarder port', () => {
  it('without a forwarder, a policy homed elsewhere fails as configured with home_unreachable', async () => {
    const { decision } = agent();
    const d = await decision({ policy: 'away', subject: 'a' });
    expect(d).toMatchObject({ allowed: false, results: [{ reason: 'home_unreachable', mode: 'strict' }] });
  });

  it('forwards to the home region after the local checks, and refunds them when the home denies', async () => {
    const seen: [string, ForwardRequest][] = [];
    let admit = true;
    const forwarder: Forwarder = {
      decide(home, request) {
        seen.push([home, request]);
        return Promise.resolve({
          results: request.checks.map((c): CheckResult => ({
            policy: c.policy,
            allowed: admit,
            remaining: admit ? 4 : 0,
            limit: 5,
            resetMs: 1000,
            retryAfterMs: admit ? 0 : 2500,
            mode: 'strict',
          })),
        });
      },
    };
    const { decision } = agent({ forwarder });
    const ok = await decision({
      checks: [
        { policy: 'away', subject: 'a' },
        { policy: 'closed', subject: 'a', cost: 4 },
      ],
    });
    expect(ok.allowed).toBe(true);
    expect(seen).toEqual([['eu', { checks: [{ policy: 'away', subject: 'a', cost: 1 }], dryRun: false }]]);
    admit = false;
    const denied = await decision({
      checks: [
        { policy: 'closed', subject: 'a', cost: 4 },
        { policy: 'away', subject: 'a' },
      ],
    });
    expect(denied.allowed).toBe(false);
    expect(denied.retryAfterMs).toBe(2500);
    // The local grant was given back: 6 tokens left from the first request, not 2 (a dry run of cost 1
    // reports what would be left after it: 5).
    const after = await decision({ policy: 'closed', subject: 'a', dryRun: true });
    expect(after.results[0]!.remaining).toBeCloseTo(5, 6);
  });

  it('a forwarder that fails applies the failure mode with home_unreachable', async () => {
    const forwarder: Forwarder = { decide: () => Promise.reject(new Error('no responders')) };
    const { decision } = agent({ forwarder });
    expect((await decision({ policy: 'away', subject: 'a' })).results[0]).toMatchObject({
      reason: 'home_unreachable',
    });
  });

  it('forwards nothing once earlier checks used the whole deadline, so no late failure can go unobserved', async () => {
    // The local check takes 50 ms of the 40 ms deadline; the strict check homed elsewhere must not be sent.
    const slow = new FlakyStore();
    const inner = slow.decide.bind(slow);
    slow.decide = (request) => {
      clock.advance(50);
      return inner(request);
    };
    let calls = 0;
    const forwarder: Forwarder = {
      decide: () => {
        calls++;
        return new Promise((_, reject) => setTimeout(() => reject(new Error('home region us: timeout')), 5));
      },
    };
    const { decide } = agent({ store: slow, forwarder });
    const r = await decide({
      checks: [
        { policy: 'closed', subject: 'late' },
        { policy: 'away', subject: 'late' },
      ],
    });
    expect(calls).toBe(0);
    // This agent spent the deadline, not the home: the request is shed (the local charge given back), never
    // answered home_unreachable of a home nobody asked.
    expect(r.status).toBe(503);
    expect(r.body).toMatchObject({ code: 'AGT_ERR_OVERLOADED', shed: 'local_deadline' });
    expect((r.body as { detail: string }).detail).toMatch(/\(local_deadline: the decision deadline passed/);
    // The forwarder's own promise is never created, so nothing rejects later unobserved (that ended the process).
  });

  it('a home that sheds: the 503 names the path in its `shed` member and words, and the path is counted', async () => {
    const forwarder: Forwarder = {
      decide: () =>
        Promise.reject(new HomeOverloadedError('eu', 'home_late', 'home region eu: taken up too late')),
    };
    const { decide, built } = agent({ forwarder });
    const r = await decide({ policy: 'away', subject: 'shed' });
    expect(r.status).toBe(503);
    expect(r.body).toMatchObject({ code: 'AGT_ERR_OVERLOADED', shed: 'home_late' });
    expect((r.body as { detail: string }).detail).toContain('(home_late: home region eu: taken up too late)');
    expect(
      await built.metrics.registry.getSingleMetricAsString('quotaplane_shed_after_admission_total'),
    ).toContain('quotaplane_shed_after_admission_total{region="us",path="home_late"} 1');
  });

  it('refuses checks homed in two different regions in one request', async () => {
    const forwarder: Forwarder = { decide: () => Promise.resolve({ results: [] }) };
    const { decide } = agent({ forwarder });
    const r = await decide({
      checks: [
        { policy: 'away', subject: 'a' },
        { policy: 'far', subject: 'a' },
      ],
    });
    expect(r.status).toBe(400);
    expect(r.body).toMatchObject({ code: 'AGT_ERR_MIXED_HOME_REGIONS' });
  });
});

describe('store failures and the deadline', () => {
  it('a store that errors: closed denies, open admits, local uses the emergency bucket', async () => {
    const store = new FlakyStore();
    store.mode = 'fail';
    const { decision } = agent({ store });
    expect((await decision({ policy: 'closed', subject: 'a' })).results[0]).toMatchObject({
      allowed: false,
      reason: 'store_unavailable',
    });
    expect((await decision({ policy: 'open', subject: 'a' })).results[0]).toMatchObject({
      allowed: true,
      reason: 'fail_open',
    });
    const local = await decision({ policy: 'local', subject: 'a' });
    expect(local.results[0]).toMatchObject({
      allowed: true,
      reason: 'emergency_bucket',
      limit: 10,
      remaining: 9,
    });
  });

  it('a layered request refused by a closed check leaves nothing charged in the emergency bucket', async () => {
    const store = new FlakyStore();
    store.mode = 'fail';
    const { decision } = agent({ store });
    // The emergency bucket of `local` holds 10 (10 % of 100); the clock stands still, so nothing refills.
    for (let i = 0; i < 12; i++) {
      const d = await decision({
        checks: [
          { policy: 'local', subject: 'drain' },
          { policy: 'closed', subject: 'drain' },
        ],
      });
      expect(d.allowed).toBe(false);
      expect(d.results[1]).toMatchObject({ reason: 'store_unavailable' });
    }
    // The same across groups: the day's group (another script) fails closed after the token bucket's took its token.
    for (let i = 0; i < 12; i++) {
      const d = await decision({
        checks: [
          { policy: 'local', subject: 'drain' },
          { policy: 'day-closed', subject: 'drain' },
        ],
      });
      expect(d.allowed).toBe(false);
      expect(d.results[0]).toMatchObject({ reason: 'emergency_bucket', remaining: 10 });
    }
    // Nothing was admitted, so nothing was spent: the emergency bucket is whole. Before, each refused request took a
    // token from it (12 requests on 10 tokens: the emergency bucket was empty and refused every check of `local`).
    const alone = await decision({ policy: 'local', subject: 'drain' });
    expect(alone.results[0]).toMatchObject({ allowed: true, reason: 'emergency_bucket', remaining: 9 });
  });

  it('a store whose reply never arrives: the decision answers when the store call times out', async () => {
    const store = new FlakyStore();
    store.mode = 'hang';
    const { decision } = agent({ store });
    const started = performance.now();
    const d = await decision({ policy: 'closed', subject: 'a' });
    const ms = performance.now() - started;
    expect(d.results[0]).toMatchObject({ reason: 'store_unavailable' });
    expect(ms).toBeGreaterThanOrEqual(35);
    expect(ms).toBeLessThan(1000);
  });

  it('lists every unknown policy at once and changes nothing', async () => {
    const store = new FlakyStore();
    const { decide } = agent({ store });
    const r = await decide({
      checks: [
        { policy: 'nope', subject: 'a' },
        { policy: 'closed', subject: 'a' },
        { policy: 'nada', subject: 'a' },
      ],
    });
    expect(r.status).toBe(404);
    expect(r.body).toMatchObject({
      code: 'AGT_ERR_UNKNOWN_POLICY',
      errors: ['unknown policy nope', 'unknown policy nada'],
    });
    expect(store.calls).toHaveLength(0);
  });
});

describe('route parameters', () => {
  it('reads a lease token up to MAX_LEASE_TOKEN_LENGTH characters from the path; a longer one is 414', async () => {
    const { built } = agent();
    await built.ready;
    const release = (token: string) => built.app.inject({ method: 'DELETE', url: `/v1/leases/${token}` });
    // Past Fastify's default of 100 characters the route is still found and the token itself is refused.
    const long = await release('x'.repeat(MAX_LEASE_TOKEN_LENGTH));
    expect(long.statusCode).toBe(400);
    expect(long.json()).toMatchObject({ code: 'AGT_ERR_INVALID_LEASE' });
    const tooLong = await release('x'.repeat(MAX_LEASE_TOKEN_LENGTH + 1));
    expect(tooLong.statusCode).toBe(414);
    expect(tooLong.json()).toMatchObject({ code: 'AGT_ERR_URI_TOO_LONG' });
  });
});

describe('observability', () => {
  it('opens a span around every store call, named by operation, ended with its outcome', async () => {
    const spans: { name: string; attributes: Record<string, unknown>; ended: boolean }[] = [];
    const tracer = {
      startSpan(name: string, options?: { attributes?: Record<string, unknown> }) {
        const span = { name, attributes: { ...options?.attributes }, ended: false };
        spans.push(span);
        return {
          setAttribute: (k: string, v: unknown) => ((span.attributes[k] = v), undefined),
          recordException: () => undefined,
          setStatus: () => undefined,
          end: () => void (span.ended = true),
        };
      },
    };
    const built = buildApp(
      {
        store: new ModelDecisionStore(clock),
        policies: new StaticPolicySource(policies),
        shares: new StaticShareView(),
        log: pino({ level: 'silent' }),
        clock,
        tracer: tracer as unknown as Tracer,
      },
      AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' }),
    );
    await built.ready;
    await built.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      payload: { policy: 'closed', subject: 'traced' },
    });
    expect(spans).toEqual([
      {
        name: 'redis decide',
        attributes: { 'db.system': 'redis', 'quotaplane.operation': 'decide', 'quotaplane.outcome': 'ok' },
        ended: true,
      },
    ]);
  });

  it('logs sampled decisions with a one-way subject fingerprint and the request id, never the subject', async () => {
    const lines: string[] = [];
    const log = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
    const built = buildApp(
      {
        store: new ModelDecisionStore(clock),
        policies: new StaticPolicySource(policies),
        shares: new StaticShareView(),
        log,
        clock,
        random: () => 0.004,
      },
      AgentConfig.parse({
        region: 'us',
        redisUrl: 'redis://127.0.0.1:1',
        policiesFile: 'unused',
        logSampleRate: 0.005,
      }),
    );
    await built.ready;
    await built.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      headers: { 'x-request-id': 'req-123' },
      payload: { policy: 'closed', subject: 'customer-secret-id' },
    });
    const decisions = lines
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((l) => l['msg'] === 'decision');
    expect(decisions).toHaveLength(1);
    expect(decisions[0]).toMatchObject({ reqId: 'req-123', policies: ['closed'], allowed: true });
    expect(decisions[0]!['subjects']).toEqual([expect.stringMatching(/^[A-Za-z0-9_-]{12}$/)]);
    expect(lines.join('\n')).not.toContain('customer-secret-id');
  });
});

describe('subjects with an HMAC secret', () => {
  it('accepts any printable subject and keys its bucket by the keyed hash, never the raw text', async () => {
    const store = new ModelDecisionStore(clock);
    const built = buildApp(
      {
        store,
        policies: new StaticPolicySource(policies),
        shares: new StaticShareView(),
        log: pino({ level: 'silent' }),
        clock,
      },
      AgentConfig.parse({
        region: 'us',
        redisUrl: 'redis://127.0.0.1:1',
        policiesFile: 'unused',
        hmacSecret: 'a-long-enough-secret',
      }),
    );
    await built.ready;
    const raw = 'Alice Example <alice@example.com>';
    const res = await built.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      payload: { policy: 'closed', subject: raw },
    });
    expect(res.statusCode).toBe(200);
    const hashed = normalizeSubject(raw, { hmacSecret: 'a-long-enough-secret' });
    expect(hashed.ok && hashed.subject.startsWith('h.')).toBe(true);
    const now = Math.round(clock.now() * 1000);
    expect(
      store.model.buckets.peek(bucketKey(1, (hashed as { subject: string }).subject, 'closed'), now)?.tokens,
    ).toBe(9_000_000);
    expect(res.body).not.toContain('alice');
  });
});
