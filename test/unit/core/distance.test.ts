import { describe, expect, it } from 'vitest';
import { loanRequest } from '../../../core/borrowing/borrow.js';
import { FIRST_ANSWER_WITHIN_MS } from '../../../core/wire/agent.js';
import { AgentConfig, DEFAULT_DECISION_DEADLINE_MS } from '../../../regional-agent/config.js';
import {
  DEFAULT_ROUND_TRIPS,
  farthestRoundTrip,
  formatRoundTrips,
  linkAllowanceMs,
  oneWayAllowanceMs,
  missingPairs,
  parseRoundTrips,
  reportIntervalProblem,
  roundTripOf,
  RoundTripsText,
  UNMEASURED_ROUND_TRIP_MS,
} from '../../../core/distance.js';

describe('round-trip matrix', () => {
  it('reads pairs in either order, 0 within a region, undefined for a pair not named', () => {
    const parsed = parseRoundTrips(DEFAULT_ROUND_TRIPS);
    expect(parsed.ok).toBe(true);
    const m = parsed.ok ? parsed.roundTrips : new Map<string, number>();
    expect(roundTripOf(m, 'us', 'eu')).toBe(70);
    expect(roundTripOf(m, 'eu', 'us')).toBe(70);
    expect(roundTripOf(m, 'ap', 'eu')).toBe(220);
    expect(roundTripOf(m, 'ap', 'ap')).toBe(0);
    expect(roundTripOf(m, 'us', 'sa')).toBeUndefined();
    expect(missingPairs(m, ['us', 'eu', 'ap', 'sa'])).toEqual(['us-sa', 'eu-sa', 'ap-sa']);
    expect(formatRoundTrips(m, ['ap', 'eu', 'us'])).toBe('ap-eu=220,ap-us=150,eu-us=70');
  });

  it('splits region names that hold dashes where only one reading names two regions', () => {
    const known = parseRoundTrips('eu-west-us-east=80', ['eu-west', 'us-east']);
    expect(known.ok && roundTripOf(known.roundTrips, 'us-east', 'eu-west')).toBe(80);
    expect(parseRoundTrips('eu-west-us-east=80')).toEqual({
      ok: false,
      problems: ['eu-west-us-east can be read more than one way'],
    });
  });

  it('lists every problem: no =, a region paired with itself, a bad number, a pair given twice', () => {
    expect(parseRoundTrips('us-eu, us-us=3, us-ap=abc, eu-ap=20, ap-eu=30, us-ap=10001')).toEqual({
      ok: false,
      problems: [
        'us-eu: write A-B=MS',
        "us-us: a region's round trip to itself is 0",
        'us-ap: the round trip is a number of ms in [0, 10000]',
        'ap-eu is given twice',
        'us-ap: the round trip is a number of ms in [0, 10000]',
      ],
    });
    expect(RoundTripsText.safeParse('us-us=3').success).toBe(false);
    expect(RoundTripsText.parse('').size).toBe(0);
  });
});

describe('timings at a distance', () => {
  it('allows a round trip and a quarter for a wait, half that for an answer, whole ms, nothing on loopback', () => {
    expect([0, 70, 150, 220].map(linkAllowanceMs)).toEqual([0, 88, 188, 275]);
    expect([0, 70, 150, 220].map(oneWayAllowanceMs)).toEqual([0, 44, 94, 138]);
  });

  it("finds each region's farthest link; an agent reads its matrix from QP_ROUND_TRIPS", () => {
    const m = RoundTripsText.parse(DEFAULT_ROUND_TRIPS);
    expect(['us', 'eu', 'ap', 'sa'].map((r) => farthestRoundTrip(m, r))).toEqual([150, 220, 220, 0]);
    const config = AgentConfig.parse({
      region: 'ap',
      redisUrl: 'redis://127.0.0.1:6379',
      natsUrl: 'nats://127.0.0.1:4222',
      roundTrips: DEFAULT_ROUND_TRIPS,
    });
    expect(roundTripOf(config.roundTrips, 'ap', 'eu')).toBe(220);
    expect(
      AgentConfig.parse({
        region: 'ap',
        redisUrl: 'redis://127.0.0.1:6379',
        natsUrl: 'nats://127.0.0.1:4222',
      }).roundTrips.size,
    ).toBe(0);
  });

  it('has a lender lend by the time its answer can still travel back, or not at all', () => {
    const need = {
      policy: 'p',
      subject: 's',
      capacity: 60,
      refillPerSecond: 1,
      borrower: 'ap',
      shares: {},
      mode: 'fill' as const,
      needMicros: 1,
      wantMicros: 5,
    };
    const ask = { lender: 'eu', mode: 'fill' as const, amountMicros: 5, expectedMicros: 5 };
    expect(loanRequest(need, ask, 1, 1500, 1000, 138)).toMatchObject({ budgetMs: 500, deadlineAtMs: 1362 });
    expect(loanRequest(need, ask, 1, 1500, 1000)).toMatchObject({ deadlineAtMs: 1500 });
    // Less time left than the answer needs to come back: nothing is asked (the answer would be `late`).
    expect(loanRequest(need, ask, 1, 1100, 1000, 138)).toBeUndefined();
  });

  it('finds a report interval too short to carry a renewal across the farthest link, and says what would do', () => {
    // The default 1000 ms carries 220 ms; the replay's 100 ms at K = 10 does not; 275 ms is exactly enough.
    expect(reportIntervalProblem(1000, 220)).toBeUndefined();
    expect(reportIntervalProblem(275, 220)).toBeUndefined();
    expect(reportIntervalProblem(100, 0)).toBeUndefined();
    expect(reportIntervalProblem(100, 220)).toBe(
      'the report interval (100 ms) is shorter than 1.25 round trips to the farthest region (275 ms for 220 ms): ' +
        'renewals from a coordinator that far come back after the interval and are ignored; raise ' +
        'QP_REPORT_INTERVAL_MS to at least 275',
    );
  });

  it("gives a caller that has not heard from an agent the agent's own first assumption: deadline + unmeasured link", () => {
    expect(FIRST_ANSWER_WITHIN_MS).toBe(
      DEFAULT_DECISION_DEADLINE_MS + linkAllowanceMs(UNMEASURED_ROUND_TRIP_MS),
    );
  });
});
