/**
 * results.json of a replay: the simulator's StrategyResult, one row per strategy and source, with `source`
 * saying which rows the simulator predicted and which the real stack produced, and for real rows what the
 * replay measured beside the metrics (compression, wall time, send lag, control messages).
 */
import { z } from 'zod';
import { ownRecord } from '../../core/own-keys.js';
import { runSimulation, type RunSpec } from '../engine/run.js';
import { roundMetric, sortedRecord, type RunSeries } from '../metrics/recorder.js';
import { percentile } from '../metrics/percentiles.js';
import { StrategyResult } from '../metrics/result.js';
import { recordedStrategy } from './recorded-strategy.js';
import type { Recording } from './recording.js';

const latency = z.strictObject({ p50: z.number(), p99: z.number(), max: z.number() });

/** What a real row measured beside the simulator's metrics. */
export const ReplayDetails = z.strictObject({
  /** K: scenario seconds per wall second. */
  compression: z.number(),
  /** The policy's name on the stack. */
  policy: z.string(),
  /** `started` (the replay ran `npm start`'s launcher) or `attached` (a running stack). */
  stack: z.enum(['started', 'attached']),
  /** Wall seconds from the first send to the last answer. */
  wallSeconds: z.number(),
  /** Mean requests per wall second. */
  wallRequestsPerSecond: z.number(),
  /** How late requests went out against their compressed arrival time, wall ms. */
  sendLagMs: latency,
  /** Requests that got no answer at all (transport error, a non-200 answer other than a shed); counted as denied. */
  noDecision: z.number().int().min(0),
  /** Requests the stack shed explicitly (503 AGT_ERR_OVERLOADED, an answer that says "busy"); counted as denied. */
  shed: z.number().int().min(0),
  /** Control messages over the replay, from the coordinator's /metrics (recording.ts ControlCounts). */
  controlMessages: z
    .strictObject({
      heartbeat: z.number(),
      usage: z.number(),
      ack: z.number(),
      bye: z.number(),
      renewals: z.number(),
      recordWrites: z.number(),
      recordDeliveries: z.number(),
      dropped: z.number(),
      loans: z.number(),
      total: z.number(),
      windowSeconds: z.number(),
    })
    .nullable(),
  /** The agents' loan answers, grants believed less than given and Redis timeouts (recording.ts AgentCounts). */
  agents: z
    .strictObject({
      loanAnswers: ownRecord(z.string(), z.number().int().min(0)),
      grantsDistrusted: z.number().int().min(0),
      storeTimeouts: z.number().int().min(0),
    })
    .optional(),
  /** Samples of the issued shares (GET /v1/allocations) behind `maxShareSum` and the shares chart. */
  shareSamples: z.number().int().min(0),
  /** Protocol timers the stack ran with, wall ms. */
  wallTiming: ownRecord(z.string(), z.number()),
  /** `--geo`: the round trips between the stack's regions, wall ms (`us-eu=70,…`); absent on loopback. */
  roundTrips: z.string().optional(),
});
export type ReplayDetails = z.infer<typeof ReplayDetails>;

export const ReplayResult = StrategyResult.extend({
  /** `simulator`: the prediction; `real-stack`: measured on the running services. */
  source: z.enum(['simulator', 'real-stack']),
  replay: ReplayDetails.optional(),
});
export type ReplayResult = z.infer<typeof ReplayResult>;

export const ReplayResults = z.array(ReplayResult);

/** A row with its series (for the charts). */
export interface ReplayRow {
  result: ReplayResult;
  series: RunSeries;
}

/** The simulator's prediction for one spec. */
export function predictedRow(spec: RunSpec): ReplayRow {
  const run = runSimulation(spec);
  return { result: { ...run.result, source: 'simulator' }, series: run.series };
}

const summary = (sorted: ArrayLike<number>) => ({
  p50: roundMetric(percentile(sorted, 50)),
  p99: roundMetric(percentile(sorted, 99)),
  max: roundMetric(sorted.length === 0 ? 0 : sorted[sorted.length - 1]!),
});

export interface RealRowContext {
  /** The prediction's spec of the strategy replayed (same scenario, seed and settings). */
  spec: RunSpec;
  compression: number;
  stack: 'started' | 'attached';
  wallTiming: Record<string, number>;
  /** `--geo`: the stack's round trips, wall ms. */
  roundTrips?: string | undefined;
}

/**
 * The real row: the simulator's engine decides nothing itself but replays the stack's answers on the same
 * arrivals, so every metric is the simulator's own code on real decisions. Latency, control messages, keys and
 * degraded reasons are then the stack's, measured during the replay (latency in wall ms).
 */
export function realRow(context: RealRowContext, recording: Recording): ReplayRow {
  const { spec, compression } = context;
  const run = runSimulation({
    ...spec,
    strategy: recordedStrategy(spec.strategy, recording, compression),
    onProgress: undefined,
  });
  const home = run.result.regions.indexOf(String(spec.settings.homeRegion ?? run.result.regions[0]));
  const strictMode = spec.strategy.mode === 'strict';
  const latencies: number[] = [];
  const forwardedLatencies: number[] = [];
  const degraded = new Map<string, number>();
  let noDecision = 0;
  let shed = 0;
  recording.answers.forEach((answer, i) => {
    const ms = answer.answeredMs - answer.sentMs;
    latencies.push(ms);
    if (strictMode && recording.arrivals[i]!.region !== home) forwardedLatencies.push(ms);
    const isShed = answer.status === 503 && answer.error === 'AGT_ERR_OVERLOADED';
    if (isShed) shed++;
    else if (answer.status !== 200) noDecision++;
    const reason =
      answer.status === 200
        ? answer.reason
        : isShed
          ? 'shed:AGT_ERR_OVERLOADED'
          : `no_decision:${answer.error ?? answer.status}`;
    if (reason !== undefined) degraded.set(reason, (degraded.get(reason) ?? 0) + 1);
  });
  latencies.sort((a, b) => a - b);
  forwardedLatencies.sort((a, b) => a - b);

  const control = recording.control;
  const scenarioSeconds = control === undefined ? 0 : control.windowSeconds * compression;
  const perScenarioSecond = (n: number) => (scenarioSeconds > 0 ? roundMetric(n / scenarioSeconds) : 0);
  const wallSeconds = recording.wallSeconds;
  const result: ReplayResult = {
    ...run.result,
    source: 'real-stack',
    controlMessagesPerSecond: control === undefined ? 0 : perScenarioSecond(control.total),
    forwardedMessagesPerSecond: perScenarioSecond(2 * recording.forwarded),
    latencyMs: summary(latencies),
    forwardedLatencyMs: forwardedLatencies.length === 0 ? null : summary(forwardedLatencies),
    forwarded: strictMode ? forwardedLatencies.length : 0,
    degraded: sortedRecord(degraded),
    counters: sortedRecord(
      new Map([
        ...Object.entries(run.result.counters),
        ...(noDecision > 0 ? [['replay:noDecision', noDecision] as const] : []),
        ...(shed > 0 ? [['replay:shed', shed] as const] : []),
      ]),
    ),
    network: {
      control: control?.total ?? 0,
      data: 2 * recording.forwarded,
      lost: 0,
      dropped: control?.dropped ?? 0,
    },
    peakKeys: recording.peakKeys,
    replay: {
      compression,
      policy: recording.policy,
      stack: context.stack,
      wallSeconds: roundMetric(wallSeconds),
      wallRequestsPerSecond: wallSeconds > 0 ? roundMetric(recording.answers.length / wallSeconds) : 0,
      sendLagMs: summary(recording.sendLagMs),
      noDecision,
      shed,
      controlMessages: control === undefined ? null : { ...control },
      ...(recording.agents === undefined ? {} : { agents: { ...recording.agents } }),
      shareSamples: recording.shares.length,
      wallTiming: context.wallTiming,
      ...(context.roundTrips === undefined ? {} : { roundTrips: context.roundTrips }),
    },
  };
  return { result, series: run.series };
}
