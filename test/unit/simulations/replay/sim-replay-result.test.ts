/**
 * The pure pieces of a replay's results: a hand-made Recording (the stack's answers to a scenario's arrivals)
 * measured by realRow with the simulator's own metrics, the prediction beside it, the Prometheus text the replay
 * reads its control counters from, and the table lines. Known answers in, exact metric values out; no stack.
 *
 * The arrivals: minute-burst with one subject for 60 s on three regions, C = 100, R = 2/s: at t = 0 each region
 * sends 150 requests of cost 1 within 200 ms (450 in all). The ideal oracle admits the first 100 (the burst) and
 * nothing else: 0.4 tokens refill in 200 ms.
 */
import { describe, expect, it } from 'vitest';
import { parseCli } from '../../../../simulations/cli-args.js';
import { runSimulation } from '../../../../simulations/engine/run.js';
import { SimConfigError } from '../../../../simulations/errors.js';
import { captureArrivals, type Arrival } from '../../../../simulations/replay/arrivals.js';
import { parsePrometheusText, sumOf } from '../../../../simulations/replay/prometheus-text.js';
import { scenarioUs } from '../../../../simulations/replay/recorded-strategy.js';
import type { ControlCounts, RealAnswer, Recording } from '../../../../simulations/replay/recording.js';
import { planReplay, type ReplayPlan } from '../../../../simulations/replay/replay-plan.js';
import { progressLine, replayProgress } from '../../../../simulations/replay/replay-progress.js';
import { replayTable, rowLabel } from '../../../../simulations/replay/replay-report.js';
import {
  predictedRow,
  realRow,
  ReplayResult,
  type ReplayRow,
} from '../../../../simulations/replay/replay-result.js';
import { agentCounts, controlCounts } from '../../../../simulations/replay/replayer.js';
import { conflictingEnv } from '../../../../simulations/replay/stack-session.js';

const K = 10;

function burstPlan(): ReplayPlan {
  const o = parseCli([
    '--scenario',
    'minute-burst',
    '--real-stack',
    '--duration',
    '60',
    '--set',
    'subjects=1',
    '--strategies',
    'dynamic,strict',
  ]);
  if (o.help) throw new Error('unexpected --help');
  return planReplay({ ...o, compression: K });
}

const plan = burstPlan();
const [idealSpec, dynamicSpec, strictSpec] = plan.predictions as [
  (typeof plan.predictions)[0],
  (typeof plan.predictions)[0],
  (typeof plan.predictions)[0],
];
const arrivals = captureArrivals(idealSpec);

/** Wall ms at which an arrival was due: scenario µs / 1000 / K. */
const dueMs = (a: Arrival) => a.at / 1000 / K;

/** A recording whose answer to arrival i is `answer(a, i)` on top of "admitted, answered the instant it was due". */
function recording(
  answer: (a: Arrival, i: number) => Partial<RealAnswer>,
  extra: Partial<Recording> = {},
): Recording {
  return {
    policy: 'replay-test',
    arrivals,
    answers: arrivals.map((a, i) => ({
      sentMs: dueMs(a),
      answeredMs: dueMs(a),
      status: 200,
      allowed: true,
      retryAfterMs: 0,
      ...answer(a, i),
    })),
    shares: [],
    peakKeys: { us: 1, eu: 1, ap: 1 },
    control: undefined,
    agents: undefined,
    forwarded: 0,
    wallSeconds: 6,
    sendLagMs: new Float64Array(arrivals.length),
    faults: [],
    ...extra,
  };
}

const context = (spec: typeof dynamicSpec) => ({
  spec,
  compression: K,
  stack: 'started' as const,
  wallTiming: { ...plan.wall },
});

describe('the arrivals of the hand-made recordings', () => {
  it('are 450 requests of subject 0 in the first 200 ms, 150 per region, ids in arrival order', () => {
    expect(arrivals).toHaveLength(450);
    expect(arrivals.every((a, i) => a.id === i && a.subject === 0 && a.cost === 1)).toBe(true);
    expect(arrivals.every((a, i) => i === 0 || arrivals[i - 1]!.at <= a.at)).toBe(true);
    expect(Math.max(...arrivals.map((a) => a.at))).toBeLessThan(200_000);
    expect([0, 1, 2].map((r) => arrivals.filter((a) => a.region === r).length)).toEqual([150, 150, 150]);
    const ideal = predictedRow(idealSpec).result;
    expect([ideal.idealAdmitted, ideal.admitted, ideal.overAdmission]).toEqual([100, 100, 0.980392]);
  });
});

describe('realRow: the simulator’s metrics on the stack’s answers', () => {
  it('every arrival admitted at once: no false denial, 450 in one second is 450 / (C + R·1) = 4.411765', () => {
    const { result } = realRow(
      context(dynamicSpec),
      recording(() => ({})),
    );
    expect(ReplayResult.parse(result)).toEqual(result);
    expect(result).toMatchObject({
      strategy: 'dynamic',
      source: 'real-stack',
      requests: 450,
      admitted: 450,
      denied: 0,
      idealAdmitted: 100,
      falseDenials: 0,
      falseDenialRate: 0,
      falseAdmissions: 350,
      falseAdmissionRate: 0.777778, // 350 / 450
      utilisation: 4.5, // 450 / 100
      overAdmission: 4.411765, // 450 / 102
      overAdmissionByWindow: { '1s': 4.411765, '10s': 3.75, '60s': 2.045455 }, // 450/102, 450/120, 450/220
      worstWindow: { subject: 0, windowS: 1, startS: 0, admitted: 450 },
      latencyMs: { p50: 0, p99: 0, max: 0 },
      degraded: {},
      peakKeys: { us: 1, eu: 1, ap: 1 },
      // No share was sampled: the regional policy reports none.
      maxShareSum: null,
      controlMessagesPerSecond: 0,
      forwardedMessagesPerSecond: 0,
      network: { control: 0, data: 0, lost: 0, dropped: 0 },
    });
    expect(result.replay).toEqual({
      compression: 10,
      policy: 'replay-test',
      stack: 'started',
      wallSeconds: 6,
      wallRequestsPerSecond: 75,
      sendLagMs: { p50: 0, p99: 0, max: 0 },
      noDecision: 0,
      shed: 0,
      controlMessages: null,
      shareSamples: 0,
      wallTiming: plan.wall,
    });
  });

  it('the ideal’s own decisions measure exactly as the ideal: 100 / 102 = 0.980392, utilisation 1', () => {
    const { result } = realRow(
      context(dynamicSpec),
      recording((_, i) => ({ allowed: i < 100 })),
    );
    const ideal = predictedRow(idealSpec).result;
    expect(result).toMatchObject({
      admitted: 100,
      falseDenials: 0,
      falseAdmissions: 0,
      falseDenialRate: 0,
      falseAdmissionRate: 0,
      utilisation: 1,
      overAdmission: ideal.overAdmission,
      overAdmissionByWindow: ideal.overAdmissionByWindow,
    });
    expect(result.overAdmission).toBe(0.980392);
  });

  it('counts an admission at the instant its answer came back, in scenario time (answeredMs × K)', () => {
    // Answer i comes back at i × 10 wall ms = i × 100 ms of scenario time: one admission every 0.1 s.
    const { result } = realRow(
      context(dynamicSpec),
      recording((_, i) => ({ answeredMs: i * 10 })),
    );
    expect(result.overAdmissionByWindow).toEqual({
      '1s': 0.107843, // [0, 1 s] holds 11 admissions: 11 / 102
      '10s': 0.841667, // 101 / 120
      '60s': 2.045455, // all 450 within 44.9 s: 450 / 220
    });
    expect(result.overAdmission).toBe(2.045455);
    expect(result.worstWindow).toEqual({ subject: 0, windowS: 60, startS: 0, admitted: 450 });
  });

  it('counts requests without a decision as denied, by cause, and summarises latency in wall ms', () => {
    const { result } = realRow(
      context(dynamicSpec),
      recording((a, i) => {
        const latency = (i % 10) + 1; // 45 answers each of 1..10 ms
        const base = { sentMs: dueMs(a), answeredMs: dueMs(a) + latency };
        if (i === 0 || i >= 410)
          return { ...base, status: 0, allowed: false, retryAfterMs: null, error: 'ECONNREFUSED' };
        if (i >= 405)
          return { ...base, status: 503, allowed: false, retryAfterMs: null, error: 'AGT_ERR_DRAINING' };
        if (i >= 400)
          return { ...base, status: 503, allowed: false, retryAfterMs: null, error: 'AGT_ERR_OVERLOADED' };
        if (i < 100) return { ...base, ...(i % 2 === 1 ? { reason: 'emergency_bucket' } : {}) };
        return { ...base, allowed: false, retryAfterMs: 500 };
      }),
    );
    expect(result).toMatchObject({
      admitted: 99,
      denied: 351,
      // Arrival 0 was one the ideal admitted: one false denial in 450.
      falseDenials: 1,
      falseDenialRate: 0.002222,
      utilisation: 0.99,
      latencyMs: { p50: 5, p99: 10, max: 10 },
      forwardedLatencyMs: null,
      forwarded: 0,
      degraded: {
        emergency_bucket: 50,
        'no_decision:AGT_ERR_DRAINING': 5,
        'no_decision:ECONNREFUSED': 41,
        // An explicit shed is an answer ("busy"), denied like the others, but not a request left without one.
        'shed:AGT_ERR_OVERLOADED': 5,
      },
    });
    expect(result.counters['replay:noDecision']).toBe(46);
    expect(result.replay!.noDecision).toBe(46);
    expect(result.counters['replay:shed']).toBe(5);
    expect(result.replay!.shed).toBe(5);
  });

  it('takes maxShareSum and the time above 1 from the shares the coordinator issued', () => {
    const { result, series } = realRow(
      context(dynamicSpec),
      recording(() => ({}), {
        shares: [
          { atMs: 0, shares: [1 / 3, 1 / 3, 1 / 3] },
          { atMs: 1000, shares: [0.5, 0.3, 0.2] },
          { atMs: 2000, shares: [0.6, 0.3, 0.15] }, // 1.05 from 20 s to 30 s of scenario time
          { atMs: 3000, shares: [0.5, 0.3, 0.2] },
        ],
      }),
    );
    expect(result.maxShareSum).toBe(1.05);
    expect(result.shareSumAboveOneS).toBe(10);
    expect(result.replay!.shareSamples).toBe(4);
    expect(series.shares).toBeDefined();
  });

  it('strict: forwarded decisions are those from outside the home region; control traffic per scenario second', () => {
    const control: ControlCounts = {
      heartbeat: 200,
      usage: 200,
      ack: 0,
      bye: 0,
      renewals: 200,
      recordWrites: 10,
      recordDeliveries: 30,
      dropped: 3,
      loans: 0,
      total: 650,
      windowSeconds: 6.5,
    };
    const { result } = realRow(
      context(strictSpec),
      recording(
        (a, i) => ({
          allowed: i < 100,
          answeredMs: dueMs(a) + (a.region === 0 ? 1 : 4),
        }),
        { control, forwarded: 260 },
      ),
    );
    expect(result).toMatchObject({
      strategy: 'strict',
      // us is the home: eu's and ap's 300 requests went there and back.
      forwarded: 300,
      forwardedLatencyMs: { p50: 4, p99: 4, max: 4 },
      latencyMs: { p50: 4, p99: 4, max: 4 },
      // 6.5 wall s × 10 = 65 scenario s: 650 / 65 and 2 × 260 / 65.
      controlMessagesPerSecond: 10,
      forwardedMessagesPerSecond: 8,
      network: { control: 650, data: 520, lost: 0, dropped: 3 },
      // The strict bucket is the home region's: its structural share vector is [1, 0, 0].
      maxShareSum: 1,
    });
    expect(result.replay!.controlMessages).toEqual(control);
  });

  it('refuses a recording of other arrivals (another seed, another setting)', () => {
    const other = recording(() => ({}));
    const changed = arrivals.map((a, i) => (i === 5 ? { ...a, cost: 2 } : a));
    expect(() => realRow(context(dynamicSpec), { ...other, arrivals: changed })).toThrow(
      new SimConfigError(
        'request 5 differs from the arrival replayed (the engine made other arrivals for the same seed)',
      ),
    );
  });
});

describe('predictedRow', () => {
  it('is the simulator’s run of the spec, marked as the simulator’s', () => {
    const row = predictedRow(dynamicSpec);
    const run = runSimulation(dynamicSpec);
    expect(row.result).toEqual({ ...run.result, source: 'simulator' });
    expect(row.result.replay).toBeUndefined();
    expect(ReplayResult.parse(row.result)).toEqual(row.result);
  });
});

describe('scenarioUs', () => {
  it('is wall ms × K in µs, rounded', () => {
    expect(scenarioUs(12.3456, 10)).toBe(123_456);
    expect(scenarioUs(0.00004, 10)).toBe(0);
    expect(scenarioUs(1, 7)).toBe(7000);
  });
});

describe('the Prometheus text the replay reads', () => {
  const text = [
    '# HELP quotaplane_protocol_messages_total Protocol messages received.',
    '# TYPE quotaplane_protocol_messages_total counter',
    'quotaplane_protocol_messages_total{kind="heartbeat",region="us"} 12',
    'quotaplane_protocol_messages_total{kind="heartbeat",region="eu"} 10',
    'quotaplane_protocol_messages_total{kind="usage",region="us"} 7 1700000000000',
    'quotaplane_allocation_writes_total 5',
    '  quotaplane_rebalance_rounds_total 1.5e3  ',
    'escaped{path="a\\"b\\\\c\\nd",raw="x\\\\ny"} 1',
    'buckets_bucket{le="+Inf"} 3',
    'low -Inf',
    'not a sample',
    'nan_metric NaN',
    '',
  ].join('\n');
  const samples = parsePrometheusText(text);

  it('reads names, labels and values, skipping comments and what is not a sample', () => {
    expect(samples.map((s) => s.name)).toEqual([
      'quotaplane_protocol_messages_total',
      'quotaplane_protocol_messages_total',
      'quotaplane_protocol_messages_total',
      'quotaplane_allocation_writes_total',
      'quotaplane_rebalance_rounds_total',
      'escaped',
      'buckets_bucket',
      'low',
    ]);
    expect(samples[2]).toEqual({
      name: 'quotaplane_protocol_messages_total',
      labels: { kind: 'usage', region: 'us' },
      value: 7,
    });
    expect(samples[4]!.value).toBe(1500);
    expect(samples[6]!.labels).toEqual({ le: '+Inf' });
    expect(samples[7]!.value).toBe(-Infinity);
  });

  it('unescapes label values: \\" \\\\ and \\n, an escaped backslash before n staying a backslash', () => {
    expect(samples[5]!.labels).toEqual({ path: 'a"b\\c\nd', raw: 'x\\ny' });
  });

  it('sums a metric over the samples whose labels match', () => {
    expect(sumOf(samples, 'quotaplane_protocol_messages_total')).toBe(29);
    expect(sumOf(samples, 'quotaplane_protocol_messages_total', { kind: 'heartbeat' })).toBe(22);
    expect(sumOf(samples, 'quotaplane_protocol_messages_total', { kind: 'heartbeat', region: 'eu' })).toBe(
      10,
    );
    expect(sumOf(samples, 'quotaplane_protocol_messages_total', { kind: 'ack' })).toBe(0);
    expect(sumOf(samples, 'quotaplane_allocation_writes_total')).toBe(5);
    expect(sumOf(samples, 'absent_total')).toBe(0);
  });

  it('controlCounts: differences of the coordinator’s counters, the renewals and deliveries derived, loans from the agents', () => {
    const agent = (requests: number, served: number) =>
      parsePrometheusText(
        [
          `quotaplane_loan_requests_total{lender="eu",answer="grant"} ${requests}`,
          `quotaplane_loans_served_total{from="eu",outcome="granted"} ${served}`,
        ].join('\n'),
      );
    const snapshot = (
      at: number,
      hb: number,
      usage: number,
      ack: number,
      writes: number,
      dropped: number,
      loans = 0,
    ) => ({
      at,
      agents: [agent(loans, 0), agent(0, loans), agent(1, 1)],
      coordinator: parsePrometheusText(
        [
          `quotaplane_protocol_messages_total{kind="heartbeat"} ${hb}`,
          `quotaplane_protocol_messages_total{kind="usage"} ${usage}`,
          `quotaplane_protocol_messages_total{kind="ack"} ${ack}`,
          `quotaplane_allocation_writes_total ${writes}`,
          `quotaplane_protocol_messages_dropped_total{reason="schema"} ${dropped}`,
        ].join('\n'),
      ),
    });
    expect(controlCounts(snapshot(1000, 40, 40, 1, 2, 0, 3), snapshot(7500, 70, 70, 5, 7, 1, 11), 3)).toEqual(
      {
        heartbeat: 30,
        usage: 30,
        ack: 4,
        bye: 0,
        renewals: 30,
        recordWrites: 5,
        recordDeliveries: 15,
        dropped: 1,
        // 8 loan requests from us, 8 answers from eu; ap's counters did not move.
        loans: 16,
        // 30 + 30 + 4 + 0 received, 30 renewals, 2 × 5 writes, 15 deliveries, 16 loan messages.
        total: 135,
        windowSeconds: 6.5,
      },
    );
  });
});

describe('agentCounts: where a real row’s delivery went', () => {
  it('sums loan answers, grants believed less than given and Redis timeouts over the agents, as differences', () => {
    const agent = (grant: number, late: number, clipped: number, timeouts: number) =>
      parsePrometheusText(
        [
          `quotaplane_loan_requests_total{lender="eu",answer="grant"} ${grant}`,
          `quotaplane_loan_requests_total{lender="ap",answer="late"} ${late}`,
          `quotaplane_loan_requests_total{lender="ap",answer="timeout"} 2`,
          `quotaplane_loan_grants_distrusted_total{lender="ap",problem="over_bound"} ${clipped}`,
          `quotaplane_store_latency_seconds_count{operation="decide",outcome="ok"} 900`,
          `quotaplane_store_latency_seconds_count{operation="decide",outcome="timeout"} ${timeouts}`,
        ].join('\n'),
      );
    const before = { agents: [agent(10, 1, 0, 3), agent(0, 0, 0, 0), parsePrometheusText('')] };
    const after = { agents: [agent(40, 5, 2, 10), agent(6, 0, 1, 0), parsePrometheusText('')] };
    // 30 + 6 grants, 4 late; the timeouts did not move (2 before and after), so they are not listed.
    expect(agentCounts(before, after)).toEqual({
      loanAnswers: { grant: 36, late: 4 },
      grantsDistrusted: 3,
      storeTimeouts: 7,
    });
  });
});

describe('the replay table and its labels', () => {
  it('labels rows by source', () => {
    const r = predictedRow(dynamicSpec).result;
    expect(rowLabel(predictedRow(idealSpec).result)).toBe('ideal (oracle)');
    expect(rowLabel(r)).toBe('dynamic (simulated)');
    expect(rowLabel({ ...r, source: 'real-stack' })).toBe('dynamic (real stack)');
  });

  it('prints the simulator’s table and one line of what each real row measured', () => {
    const real = realRow(
      context(strictSpec),
      recording(
        (_, i) => (i === 7 ? { status: 0, allowed: false, retryAfterMs: null, error: 'ECONNRESET' } : {}),
        {
          sendLagMs: Float64Array.from({ length: 450 }, (_, i) => (i < 440 ? 0.5 : 3)),
          control: {
            heartbeat: 180,
            usage: 180,
            ack: 7,
            bye: 0,
            renewals: 180,
            recordWrites: 12,
            recordDeliveries: 36,
            dropped: 0,
            loans: 0,
            total: 607,
            windowSeconds: 6.2,
          },
          agents: { loanAnswers: { grant: 3, timeout: 1 }, grantsDistrusted: 1, storeTimeouts: 2 },
        },
      ),
    );
    const rows: ReplayRow[] = [predictedRow(idealSpec), predictedRow(strictSpec), real];
    const table = replayTable(rows).split('\n');
    expect(table[0]).toMatch(/^\| strategy +\| overAdmission/);
    expect(table.filter((l) => l.startsWith('| ideal (oracle) '))).toHaveLength(1);
    expect(table.filter((l) => l.startsWith('| strict (simulated) '))).toHaveLength(1);
    expect(table.filter((l) => l.startsWith('| strict (real stack) '))).toHaveLength(1);
    expect(table).toContain(
      'strict (real stack): 450 requests in 6.0 s of wall time at 10× (75/s), sent late by p50 0.5 / p99 3.0 ms, ' +
        '1 without a decision, 0 shed, degraded: no_decision:ECONNRESET 1; control messages 607 (heartbeats 180, usage 180, acks 7, record writes 12, loans 0); ' +
        'loan answers grant 3, timeout 1, grants believed less than given 1, Redis timeouts 2',
    );
  });
});

describe('replay progress and the caller’s environment', () => {
  it('progressLine', () => {
    expect(
      progressLine({
        policy: 'p',
        wallMs: 1500,
        totalWallMs: 6000,
        sent: 10,
        total: 20,
        answered: 9,
        admitted: 8,
      }),
    ).toBe('replay p: 1.5/6.0 s, sent 10/20, answered 9, admitted 8');
    // Past the end (answers still coming) the clock stops at the total.
    expect(
      progressLine({
        policy: 'p',
        wallMs: 6400,
        totalWallMs: 6000,
        sent: 20,
        total: 20,
        answered: 20,
        admitted: 8,
      }),
    ).toBe('replay p: 6.0/6.0 s, sent 20/20, answered 20, admitted 8');
  });

  it('writes a plain line at each tenth of the wall time when stderr is not a terminal, nothing when quiet', () => {
    const lines: string[] = [];
    const sink = replayProgress({ isTTY: false, write: (t: string) => lines.push(t) }, false);
    for (const wallMs of [0, 100, 600, 700, 1199, 1200, 6000, 6100])
      sink.update({ policy: 'p', wallMs, totalWallMs: 6000, sent: 0, total: 1, answered: 0, admitted: 0 });
    expect(lines.map((l) => l.split(',')[0])).toEqual([
      'replay p: 0.0/6.0 s',
      'replay p: 0.6/6.0 s',
      'replay p: 1.2/6.0 s',
      'replay p: 6.0/6.0 s',
    ]);
    const quiet: string[] = [];
    const none = replayProgress({ isTTY: false, write: (t: string) => quiet.push(t) }, true);
    none.update({ policy: 'p', wallMs: 0, totalWallMs: 1, sent: 0, total: 1, answered: 0, admitted: 0 });
    expect(quiet).toEqual([]);
  });

  it('conflictingEnv names every variable the replay sets itself', () => {
    const reserved = ['QP_COORDINATOR_ROUND_MS', 'QP_COORDINATOR_LEASE_MS', 'QP_AGENT_DECISION_DEADLINE_MS'];
    expect(() => conflictingEnv({ PATH: '/bin', QP_COORDINATOR_LEASE_MS: '' }, reserved)).not.toThrow();
    expect(() => conflictingEnv({ QP_COORDINATOR_ROUND_MS: '5' }, reserved)).toThrow(
      new SimConfigError(
        '--real-stack sets QP_COORDINATOR_ROUND_MS itself (from --compress and the settings): unset it or use --set',
      ),
    );
    expect(() =>
      conflictingEnv({ QP_COORDINATOR_ROUND_MS: '5', QP_AGENT_DECISION_DEADLINE_MS: '9' }, reserved),
    ).toThrow(
      new SimConfigError(
        '--real-stack sets QP_COORDINATOR_ROUND_MS, QP_AGENT_DECISION_DEADLINE_MS itself (from --compress and the settings): unset them or use --set',
      ),
    );
  });
});
