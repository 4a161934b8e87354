import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { ManualClock } from '../../../../core/clock.js';
import {
  DailyBudgetModel,
  dayBoundariesMs,
  dayLimitMicros,
  DayWindowError,
  sizedDay,
} from '../../../../core/models/daily-budget.js';
import { ShareHistory } from '../../../../core/lease/share-history.js';
import { LONGEST_DAY_SECONDS } from '../../../../core/kinds/daily/traits.js';
import { parsePolicy, PolicySpec } from '../../../../core/policy/policy.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { buildApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { ownBudgetReason } from '../../../../regional-agent/decisions/group-run.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import { checkDayExpectations, dailyBudgetCases, prepareDayCase } from '../../../cases/daily-budget-cases.js';

const iso = (ms: number) => new Date(ms).toISOString();

describe('calendar days in a time zone (Intl)', () => {
  it.each([
    [
      'UTC',
      '2026-12-04T10:00:00Z',
      [
        '2026-12-03T00:00:00.000Z',
        '2026-12-04T00:00:00.000Z',
        '2026-12-05T00:00:00.000Z',
        '2026-12-06T00:00:00.000Z',
      ],
    ],
    // Spring forward: 8 March 2026 is 23 h long in New York; fall back: 1 November is 25 h.
    [
      'America/New_York',
      '2026-03-08T12:00:00Z',
      [
        '2026-03-07T05:00:00.000Z',
        '2026-03-08T05:00:00.000Z',
        '2026-03-09T04:00:00.000Z',
        '2026-03-10T04:00:00.000Z',
      ],
    ],
    [
      'America/New_York',
      '2026-11-01T12:00:00Z',
      [
        '2026-10-31T04:00:00.000Z',
        '2026-11-01T04:00:00.000Z',
        '2026-11-02T05:00:00.000Z',
        '2026-11-03T05:00:00.000Z',
      ],
    ],
    [
      'Asia/Kolkata',
      '2026-12-04T18:29:59.999Z',
      [
        '2026-12-02T18:30:00.000Z',
        '2026-12-03T18:30:00.000Z',
        '2026-12-04T18:30:00.000Z',
        '2026-12-05T18:30:00.000Z',
      ],
    ],
    // Lord Howe moves its clocks by half an hour: a day of 23.5 h.
    [
      'Australia/Lord_Howe',
      '2026-10-04T12:00:00Z',
      [
        '2026-10-02T13:30:00.000Z',
        '2026-10-03T13:30:00.000Z',
        '2026-10-04T13:00:00.000Z',
        '2026-10-05T13:00:00.000Z',
      ],
    ],
    // Santiago skips midnight: 6 September 2026 begins at 01:00 local.
    [
      'America/Santiago',
      '2026-09-06T12:00:00Z',
      [
        '2026-09-05T04:00:00.000Z',
        '2026-09-06T04:00:00.000Z',
        '2026-09-07T03:00:00.000Z',
        '2026-09-08T03:00:00.000Z',
      ],
    ],
  ])('%s around %s', (zone, at, want) => {
    expect(dayBoundariesMs(zone, Date.parse(at)).map(iso)).toEqual(want);
  });

  it('the exact instant a day starts belongs to it; the one before to the day before', () => {
    const start = Date.parse('2026-03-09T04:00:00Z');
    expect(iso(dayBoundariesMs('America/New_York', start)[1])).toBe('2026-03-09T04:00:00.000Z');
    expect(iso(dayBoundariesMs('America/New_York', start - 1)[1])).toBe('2026-03-08T05:00:00.000Z');
  });
});

describe('daily policies: the schema', () => {
  it('derives the rate from the day; the zone defaults to UTC', () => {
    expect(
      parsePolicy({ name: 'd', kind: 'daily', capacity: 86_400, timeZone: 'Europe/Paris' }),
    ).toMatchObject({
      kind: 'daily',
      refillPerSecond: 1,
      // 25 h, the longest calendar day (a fall-back day): the lowest share is looked up that far back.
      idleTtlSeconds: 90_000,
      timeZone: 'Europe/Paris',
    });
  });

  it('refuses an unknown zone, a rate of its own, a local failure mode, an idle TTL under 25 h, a zone on another kind', () => {
    const r = PolicySpec.safeParse({
      kind: 'daily',
      capacity: 100,
      timeZone: 'Mars/Olympus',
      refillPerSecond: 5,
      onStoreFailure: 'local',
      idleTtlSeconds: 86_400,
    });
    expect(r.error?.issues.map((i) => i.path.join('.')).sort()).toEqual([
      'idleTtlSeconds',
      'onStoreFailure',
      'refillPerSecond',
      'timeZone',
    ]);
    expect(
      PolicySpec.safeParse({ capacity: 1, refillPerSecond: 1, timeZone: 'UTC' }).error?.issues[0]?.path,
    ).toEqual(['timeZone']);
  });
});

describe('daily budgets on a 25-hour day (regression: the lowest share was looked up 24 h back)', () => {
  // Europe/Paris falls back on 2026-10-25: the day runs from 22:00Z on the 24th to 23:00Z on the 25th, 25 h.
  const dayStart = Date.parse('2026-10-24T22:00:00Z');
  const into = (h: number, m: number) => dayStart + (h * 60 + m) * 60_000;
  const policy = parsePolicy({ name: 'daily', kind: 'daily', capacity: 1000, timeZone: 'Europe/Paris' });
  const subject = 'tenant-1';

  /**
   * Two regions, each with its own store and its agent's share history of the policy, through one day: A at 0.9
   * counts 900 at 00:30; A shrinks to 0.1 at 00:33 and B grows from 0.1 to 0.9 at 00:36 (shares sum to at most
   * 1 throughout); at 23:54 by the clock (24 h 54 min into the day) B counts what its counter admits. The
   * day's total with a lowest-share lookback of `lookbackSeconds`.
   */
  function dayTotal(lookbackSeconds: number): { a: number; b: number } {
    const histories = { a: new ShareHistory(0), b: new ShareHistory(0) };
    const stores = { a: new DailyBudgetModel(), b: new DailyBudgetModel() };
    const shares = { a: 0.9, b: 0.1 };
    const set = (region: 'a' | 'b', share: number, at: number) => {
      shares[region] = share;
      histories[region].push(policy.name, share, at, lookbackSeconds);
    };
    /** Units of cost 1 the region's counter admits at `at`, sized as the agent sizes it (core/models/daily-budget.ts). */
    const countAll = (region: 'a' | 'b', at: number): number => {
      const share = shares[region];
      const lowest = histories[region].lowest(policy.name, share, lookbackSeconds * 1000, at);
      const check = sizedDay(policy, `day:${subject}`, 1, { share, epoch: 1, lowest }, at);
      let admitted = 0;
      while (stores[region].evaluate({ checks: [check] }, at * 1000).allowed) admitted++;
      return admitted;
    };
    // The shares in force since the day before.
    set('a', 0.9, dayStart - 12 * 3_600_000);
    set('b', 0.1, dayStart - 12 * 3_600_000);
    const a = countAll('a', into(0, 30));
    set('a', 0.1, into(0, 33));
    set('b', 0.9, into(0, 36));
    const b = countAll('b', into(24, 54));
    return { a, b };
  }

  it('the 23:54 instant is still the same calendar day in Paris, 24 h 54 min after it began', () => {
    expect(dayBoundariesMs('Europe/Paris', into(24, 54))[1]).toBe(dayStart);
    expect(dayBoundariesMs('Europe/Paris', into(24, 54))[2] - dayStart).toBe(LONGEST_DAY_SECONDS * 1000);
  });

  it("keeps the day's total within the capacity with the policy's 25 h lookback; a 24 h one counted 1800", () => {
    expect(policy.idleTtlSeconds).toBe(LONGEST_DAY_SECONDS);
    // B still sizes by the 0.1 it held at 00:00: floor(1000 × 0.1) = 100. 900 + 100 = 1000.
    expect(dayTotal(policy.idleTtlSeconds)).toEqual({ a: 900, b: 100 });
    // The old rule: 24 h back from 23:54 is 00:54 of the same day, after B grew, so its lowest share is 0.9 and
    // its limit 900: 900 + 900 = 1800 of 1000.
    expect(dayTotal(86_400)).toEqual({ a: 900, b: 900 });
  });
});

describe('daily-budget model: the case table', () => {
  for (const c of dailyBudgetCases) {
    it(c.name, () => {
      const model = new DailyBudgetModel();
      const problems: string[] = [];
      prepareDayCase('p', c).forEach(({ step, request, nowMicros }, i) => {
        let reply;
        try {
          reply = model.evaluate(request, nowMicros);
        } catch (error) {
          if (!(error instanceof DayWindowError)) throw error;
          reply = 'no_day' as const;
        }
        for (const p of checkDayExpectations(step, reply)) problems.push(`call ${i} (at ${step.at}): ${p}`);
      });
      expect(problems).toEqual([]);
    });
  }
});

describe('daily budgets in decisions', () => {
  const daily = parsePolicy({
    name: 'daily',
    kind: 'daily',
    capacity: 5,
    timeZone: 'America/New_York',
    maxCost: 5,
  });
  const rate = parsePolicy({ name: 'rate', capacity: 3, refillPerSecond: 1e-4, maxCost: 3 });

  function agent() {
    // 23:00 in New York on 3 December 2026.
    const clock = new ManualClock(Date.parse('2026-12-04T04:00:00Z'));
    const store = new ModelDecisionStore(clock);
    const built = buildApp(
      {
        store,
        policies: new StaticPolicySource([daily, rate]),
        shares: new StaticShareView({ daily: 0.6 }),
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
    const post = async (body: object) => {
      await built.ready;
      const res = await built.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
      expect(res.statusCode, res.body).toBe(200);
      return DecisionResponse.parse(res.json());
    };
    return { clock, post };
  }

  it("a region's share of the day: floor(5 × 0.6) = 3; the day ends at New York's midnight", async () => {
    const { clock, post } = agent();
    const first = await post({ policy: 'daily', subject: 't', cost: 2 });
    expect(first.results[0]).toMatchObject({ allowed: true, limit: 3, remaining: 1, resetMs: 3_600_000 });
    const over = await post({ policy: 'daily', subject: 't', cost: 2 });
    // A share of 0.6: this region's part of the day is used; the rest may be left in other regions.
    expect(over.results[0]).toMatchObject({
      allowed: false,
      retryAfterMs: 3_600_000,
      reason: 'share_exhausted',
    });
    clock.advance(3_600_000);
    expect((await post({ policy: 'daily', subject: 't', cost: 3 })).allowed).toBe(true);
  });

  it('layered with a rate in one all-or-nothing decision: a denial by the rate charges nothing of the day', async () => {
    const { post } = agent();
    const body = (cost: number) => ({
      checks: [
        { policy: 'daily', subject: 't2', cost },
        { policy: 'rate', subject: 't2', cost },
      ],
    });
    expect((await post(body(2))).allowed).toBe(true);
    const denied = await post(body(2));
    expect(denied.allowed).toBe(false);
    expect(denied.results.map((r) => r.remaining)).toEqual([1, 1]);
    // Neither had room for 2: the day (this region's share, 0.6) and the rate (its whole budget) each say why.
    expect(denied.results.map((r) => r.reason)).toEqual(['share_exhausted', 'subject_exhausted']);
    expect((await post({ policy: 'daily', subject: 't2', dryRun: true })).results[0]!.remaining).toBe(0);
  });
});

describe('why a daily refusal says what it says', () => {
  it('compares limits in micro-units: a capacity finer than a micro-unit is still whole at share 1', () => {
    const capacity = 2.5000001;
    const whole = dayLimitMicros(capacity, 1);
    expect(whole).toBe(2_500_000);
    expect(ownBudgetReason({ mode: 'regional' }, dayLimitMicros(capacity, 1), whole)).toBe(
      'subject_exhausted',
    );
    expect(ownBudgetReason({ mode: 'regional' }, dayLimitMicros(capacity, 0.6), whole)).toBe(
      'share_exhausted',
    );
    expect(ownBudgetReason({ mode: 'local' }, dayLimitMicros(capacity, 0.6), whole)).toBe(
      'subject_exhausted',
    );
  });
});
