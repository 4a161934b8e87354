/**
 * Every registered kind's declared traits (core/kinds/) checked against what the code does with a policy of that
 * kind: the schema, the router, a lender, and the agent's routes on the model store. A trait that drifts from the
 * code (a kind said not to borrow that a lender lends from, one said to give no grants that the grant route
 * serves) fails here, and so does a kind's schema fragment declaring a field that is not its own.
 */
import { existsSync, readdirSync } from 'node:fs';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionReason } from '../../../../core/wire/agent.js';
import { acceptLoan } from '../../../../core/borrowing/lender.js';
import { ManualClock } from '../../../../core/clock.js';
import { allKinds, KIND_NAMES, KINDS, type KindTraits } from '../../../../core/kinds/index.js';
import { isLogKind, parsePolicy, PolicyKind, type PolicyInput } from '../../../../core/policy/policy.js';
import { unitChanges } from '../../../../core/policy/policy-version.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { CheckRouter } from '../../../../regional-agent/decisions/check-router.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';

const NOW = 1_750_000_000_000;
const CAPACITY = 100;
const WINDOW = 60;

/** The smallest valid policy of `k`, as an operator writes it, with `extra` fields. */
function spec(k: KindTraits, extra: Partial<PolicyInput> = {}): PolicyInput {
  return {
    name: k.kind.replace('_', '-'),
    kind: k.kind,
    capacity: CAPACITY,
    ...(k.rate === 'declared' ? { refillPerSecond: 1 } : {}),
    ...(k.window === undefined ? {} : { [k.window]: WINDOW }),
    ...extra,
  };
}

const parses = (input: PolicyInput): boolean => {
  try {
    parsePolicy(input);
    return true;
  } catch {
    return false;
  }
};

function agent(policy: ReturnType<typeof parsePolicy>) {
  const clock = new ManualClock(NOW);
  const built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource([policy]),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      random: () => 0,
    },
    AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' }),
  );
  return async (method: 'POST' | 'DELETE', url: string, payload?: object) => {
    await built.ready;
    const res = await built.app.inject({ method, url, ...(payload === undefined ? {} : { payload }) });
    return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
  };
}

describe('the kind registry', () => {
  it('registers every kind of the schema, each under its own name', () => {
    expect(Object.keys(KINDS)).toEqual([...KIND_NAMES]);
    expect(PolicyKind.options).toEqual([...KIND_NAMES]);
    for (const [name, k] of Object.entries(KINDS)) expect(k.kind).toBe(name);
  });

  it('every decision script of lua/ belongs to some kind (reservations and the terms record are kind-independent)', () => {
    const claimed = new Set(allKinds().flatMap((k) => k.scripts));
    const scripts = readdirSync('lua')
      .filter((f) => f.endsWith('.lua') && !f.startsWith('reservation_') && f !== 'terms_until.lua')
      .map((f) => f.slice(0, -'.lua'.length));
    expect(scripts.filter((s) => !claimed.has(s as never))).toEqual([]);
  });

  describe.each(allKinds().map((k) => [k.kind, k] as const))('%s', (_, k) => {
    it('names Lua scripts that exist, and registers a model class and a sizing function', () => {
      expect(k.scripts.length).toBeGreaterThan(0);
      for (const script of k.scripts) expect(existsSync(`lua/${script}.lua`), script).toBe(true);
      expect(k.model.toString().startsWith('class ')).toBe(true);
      expect(k.sizing).toBeTypeOf('function');
    });

    it("its schema fragment's fields are its own: each refused for every other kind but those sharing it as their window", () => {
      const own = Object.keys(k.schema.fields);
      for (const other of allKinds().filter((o) => o.kind !== k.kind)) {
        for (const field of Object.keys(other.schema.fields)) expect(own).not.toContain(field);
      }
      // A valid value of each kind's own field (a field added to a fragment needs one here).
      const values = new Map<string, unknown>([
        ['shards', 2],
        ['newSubjects', { perMinute: 10 }],
        ['windowSeconds', WINDOW],
        ['leaseSeconds', WINDOW],
        ['timeZone', 'Europe/Paris'],
      ]);
      for (const field of own) {
        expect(values.has(field), `a value of ${field} for this test`).toBe(true);
        const extra = Object.fromEntries([[field, values.get(field)]]) as Partial<PolicyInput>;
        expect(parses(spec(k, extra)), `${field} on ${k.kind}`).toBe(true);
        // Refused for every other kind, except a window field (`KindTraits.window`): declared by this one
        // fragment, it is shared by every kind whose traits hold their window in it.
        for (const other of allKinds().filter((o) => o.kind !== k.kind)) {
          expect(parses(spec(other, extra)), `${field} on ${other.kind}`).toBe(other.window === field);
        }
      }
    });

    it('declares refusal reasons the wire knows, each matching its capability', () => {
      for (const r of k.refusalReasons) expect(DecisionReason.options).toContain(r);
      expect(k.refusalReasons.includes('shard_exhausted')).toBe(k.shards);
      expect(k.refusalReasons.includes('subject_flood')).toBe(k.newSubjects);
      expect(k.refusalReasons.includes('shared_bucket')).toBe(k.newSubjects);
      expect(k.refusalReasons.includes('emergency_bucket')).toBe(k.emergencyBucket);
    });

    it('the schema takes exactly the options its traits allow', () => {
      expect(parses(spec(k))).toBe(true);
      expect(parses(spec(k, { shards: 2 }))).toBe(k.shards);
      expect(parses(spec(k, { newSubjects: { perMinute: 10 } }))).toBe(k.newSubjects);
      expect(parses(spec(k, { mode: 'strict', homeRegion: 'us' }))).toBe(k.strictMode);
      expect(parses(spec(k, { onStoreFailure: 'local' }))).toBe(k.emergencyBucket);
      const gold = { capacity: 2 * CAPACITY, ...(k.rate === 'declared' ? { refillPerSecond: 2 } : {}) };
      expect(parses(spec(k, { classes: { gold } }))).toBe(k.classes);
      expect(parses(spec(k, { capacity: 100.5 }))).toBe(!k.wholeUnits);
      for (const field of ['windowSeconds', 'leaseSeconds'] as const) {
        if (k.window !== field) expect(parses(spec(k, { [field]: WINDOW })), field).toBe(false);
      }
      expect(parses(spec(k, { timeZone: 'Europe/Paris' }))).toBe(k.defaults.timeZone !== undefined);
    });

    it('promises a limit its rate and window can state (the conservation checker holds it to it)', () => {
      const rule = { declared: ['burst'], window: ['rolling', 'alignedWindow'], day: ['calendarDay'] }[
        k.rate
      ];
      expect(rule).toContain(k.promise);
      if (k.promise === 'rolling' || k.promise === 'alignedWindow') expect(k.window).toBeDefined();
    });

    it('derives its rate and idle TTL as declared', () => {
      const p = parsePolicy(spec(k));
      const rate = { declared: 1, window: CAPACITY / WINDOW, day: CAPACITY / 86_400 }[k.rate];
      expect(p.refillPerSecond).toBe(rate);
      expect(p.idleTtlSeconds).toBeGreaterThanOrEqual(k.defaults.minIdleTtlSeconds ?? 0);
      if (k.defaults.minIdleTtlSeconds !== undefined)
        expect(p.idleTtlSeconds).toBe(k.defaults.minIdleTtlSeconds);
      // A policy written with the kind's default zone means what one without a zone means.
      const zoned = { ...p, timeZone: k.defaults.timeZone };
      expect(unitChanges(p, zoned)).toEqual([]);
    });

    it('is routed to the store group it declares', () => {
      const p = parsePolicy(spec(k));
      const router = new CheckRouter(new StaticPolicySource([p]), new StaticShareView(), {
        region: 'us',
        canForward: false,
        now: () => NOW,
        random: () => 0,
      });
      const check = router.route(p, 'a', 1);
      expect(check.route).toBe(k.decidedBy);
      expect(isLogKind(k.kind)).toBe(k.decidedBy === 'log');
      // Sized by the kind's own registered sizing, under the group's key.
      const sized = check.bucket ?? check.log ?? check.day;
      expect(sized).toBeDefined();
      const key = sized?.key ?? '';
      const share = { share: 1, epoch: 0 };
      const own = k.decidedBy === 'day' ? k.sizing(p, key, 1, share, NOW) : k.sizing(p, key, 1, share);
      expect(sized).toEqual(own);
    });

    it('lends (and so borrows) only when it says it borrows', () => {
      const p = parsePolicy(spec(k));
      // Only the token-bucket store group borrows for a short bucket.
      if (k.borrows) expect(k.decidedBy).toBe('store');
      const loan = acceptLoan(
        {
          fromRegion: 'eu',
          policy: p.name,
          version: p.version,
          subject: 'a',
          mode: 'fill',
          amountMicros: 1_000_000,
          budgetMs: 1000,
          deadlineAtMs: NOW + 1000,
        },
        p,
        NOW,
      );
      expect('error' in loan ? loan.error : 'accepted').toBe(k.borrows ? 'accepted' : 'not_regional');
    });

    it("the agent's routes on the model store answer as its traits say", async () => {
      const p = parsePolicy(spec(k));
      const call = agent(p);
      const whole = k.wholeUnits ? 1 : 0.5;

      const grant = await call('POST', '/v1/grants', { policy: p.name, subject: 'g', amount: 1 });
      if (k.grants) expect(grant.status).toBe(200);
      else expect(grant).toMatchObject({ status: 400, body: { code: 'AGT_ERR_GRANT_NOT_ALLOWED' } });

      const half = await call('POST', '/v1/decisions', { policy: p.name, subject: 'h', cost: 0.5 });
      if (k.wholeUnits) expect(half).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_COST' } });
      else expect(half).toMatchObject({ status: 200, body: { allowed: true } });

      const dry = { policy: p.name, subject: 'd', cost: whole, dryRun: true };
      const first = await call('POST', '/v1/decisions', dry);
      const second = await call('POST', '/v1/decisions', dry);
      const uncharged = first.status === 200 && second.body['remaining'] === first.body['remaining'];
      expect(uncharged).toBe(k.dryRun);

      const once = { policy: p.name, subject: 'i', cost: whole, idempotencyKey: 'k-1' };
      const charged = await call('POST', '/v1/decisions', once);
      const again = await call('POST', '/v1/decisions', once);
      expect(charged).toMatchObject({ status: 200, body: { allowed: true } });
      expect(again.status === 200 && again.body['replayed'] === true).toBe(k.idempotency);

      const decided = await call('POST', '/v1/decisions', { policy: p.name, subject: 'l', cost: 1 });
      expect(decided).toMatchObject({ status: 200, body: { allowed: true } });
      const lease = (decided.body['results'] as { lease?: string }[])[0]?.lease;
      expect(lease !== undefined).toBe(k.leases);
      if (lease !== undefined) expect((await call('DELETE', `/v1/leases/${lease}`)).status).toBe(200);

      const reserved = await call('POST', '/v1/reservations', { policy: p.name, subject: 'r', amount: 1 });
      if (k.reservations) expect(reserved.status).toBe(200);
      else expect(reserved).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_RESERVATION' } });
    });
  });
});
