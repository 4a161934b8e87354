/**
 * `npm run simulate -- --scenario NAME --real-stack`: plan (every check before anything starts), capture the
 * scenario's arrivals from the simulator's engine, predict with the simulator, start (or attach to) the stack,
 * then for each strategy create its policy through the admin API, wait until every agent holds it, replay the
 * arrivals in compressed time, delete the policy, and measure the real answers with the simulator's metrics.
 * Whatever happens (an error, Ctrl-C), the policy is deleted and a started stack is stopped before this returns.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Scenario } from '../scenario.js';
import { captureArrivals } from './arrivals.js';
import { DecisionClient } from './decision-client.js';
import { sumOf } from './prometheus-text.js';
import {
  planReplay,
  replayLoad,
  REPLAY_STACK_VARS,
  type ReplayOptions,
  type ReplayPlan,
} from './replay-plan.js';
import { ReplayError } from './replay-errors.js';
import { replayTable, writeReplay } from './replay-report.js';
import { predictedRow, realRow, type ReplayRow } from './replay-result.js';
import { replayArrivals, type ReplayProgress } from './replayer.js';
import { StackClient } from './stack-client.js';
import { attachStack, conflictingEnv, startStack, type StackSession } from './stack-session.js';

export interface ReplayRunOptions extends ReplayOptions {
  outDir: string;
  /** State file of a running stack to replay against instead of starting one. */
  attach: string | undefined;
  /** Repository root, where `scripts/stack.ts` runs from. */
  root: string;
  /** The caller's environment (the launcher inherits it; QP_ADMIN_TOKEN names an attached stack's token). */
  env: Readonly<Record<string, string | undefined>>;
}

export interface ReplaySinks {
  /** One line of news on stderr. */
  say(line: string): void;
  progress(p: ReplayProgress): void;
  /** Aborted on Ctrl-C: the replay stops, cleans up and throws ReplayInterrupted. */
  signal: AbortSignal;
}

export interface ReplayOutcome {
  plan: ReplayPlan;
  rows: ReplayRow[];
  table: string;
  written: string[];
}

/** Requests in flight per agent on the geo topology (more wait for a socket). */
const GEO_SOCKETS_PER_AGENT = 1024;

/** How long every agent may take to hold a new policy, wall ms. */
const READY_FOR_POLICY_MS = 20_000;

/** An attached stack must run the plan's round (within a factor of two): read from its round counter. */
async function checkAttachedTiming(client: StackClient, plan: ReplayPlan): Promise<void> {
  const rounds = async () => ({
    at: performance.now(),
    n: sumOf(await client.coordinatorMetrics(), 'quotaplane_rebalance_rounds_total'),
  });
  const a = await rounds();
  await sleep(Math.max(1000, 10 * plan.wall.roundMs));
  const b = await rounds();
  const measured = b.n > a.n ? (b.at - a.at) / (b.n - a.n) : Infinity;
  const expected = plan.wall.roundMs;
  if (measured < expected / 2 || measured > expected * 2) {
    const env = Object.entries(plan.stackEnv)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    throw new ReplayError(
      `the attached coordinator runs a round every ${Number.isFinite(measured) ? measured.toFixed(0) : '∞'} ms; ` +
        `--compress ${plan.compression} needs ${expected} ms. Start the stack with\n  ${env} QP_STACK_STATE_FILE=… npm start`,
    );
  }
}

function describePlan(plan: ReplayPlan, requests: number, wallSeconds: number, meanRate: number): string {
  const s = plan.settings;
  return (
    `replaying ${plan.scenario.name} (seed ${plan.seed}): ${requests} requests, ${s.durationS} s compressed ${plan.compression}× ` +
    `into ${wallSeconds.toFixed(1)} s per strategy (${meanRate.toFixed(0)} requests/s); ` +
    `policy C=${s.capacity}, R=${s.refillPerSecond}/s (on the stack ${s.refillPerSecond * plan.compression}/s); ` +
    `round ${plan.wall.roundMs} ms, reports ${plan.wall.reportIntervalMs} ms, lease ${plan.wall.leaseMs} ms, ` +
    `grace ${plan.wall.graceMs} ms, skew ${plan.wall.skewMs} ms, decision deadline ${plan.wall.decisionDeadlineMs} ms of wall time` +
    (plan.roundTrips === undefined
      ? ''
      : `; geo topology, round trips ${plan.roundTrips} ms of wall time (the prediction's links: ${s.links}, scenario ms one way)`)
  );
}

export async function runReplay(o: ReplayRunOptions, sinks: ReplaySinks): Promise<ReplayOutcome> {
  const plan = planReplay(o);
  if (o.attach === undefined) conflictingEnv(o.env, REPLAY_STACK_VARS);
  const arrivals = captureArrivals(plan.predictions[0]!);
  const { wallSeconds, meanRate } = replayLoad(plan, arrivals.length);
  const predicted = plan.predictions.map((spec) => predictedRow(spec));
  sinks.say(describePlan(plan, arrivals.length, wallSeconds, meanRate));

  const outDir = resolve(o.outDir);
  mkdirSync(outDir, { recursive: true });
  let session: StackSession;
  if (o.attach !== undefined) {
    session = await attachStack(o.attach, o.env);
    sinks.say(`attached to the stack at ${session.endpoints.coordinator}`);
  } else {
    const logFile = join(outDir, 'stack.log');
    rmSync(logFile, { force: true });
    sinks.say(
      `starting the stack (npm start${plan.roundTrips === undefined ? '' : ' -- --geo'} on free loopback ports; its output in ${logFile})`,
    );
    session = await startStack({
      root: o.root,
      env: o.env,
      stackEnv: plan.stackEnv,
      logFile,
      stateFile: join(outDir, 'stack-state.json'),
      signal: sinks.signal,
    });
    sinks.say(
      `stack ready: coordinator ${session.endpoints.coordinator}, agents ${session.endpoints.agents.join(', ')}`,
    );
  }

  const client = new StackClient(session.endpoints);
  // On the geo topology a decision may wait a loan across a link (the deadline and the farthest link's allowance,
  // over half a second of wall time): at a few hundred requests a second to one region, 64 sockets would queue
  // requests in the client, a delay the prediction does not have.
  const decisions = new DecisionClient(
    session.endpoints.agents,
    plan.roundTrips === undefined ? 64 : GEO_SOCKETS_PER_AGENT,
  );
  const rows: ReplayRow[] = [predicted[0]!];
  try {
    if (session.kind === 'attached') await checkAttachedTiming(client, plan);
    for (const [i, target] of plan.targets.entries()) {
      const policy = `replay-${target.strategy.name}-${randomBytes(4).toString('hex')}`;
      await client.createPolicy(policy, target.policy);
      let recording;
      try {
        await client.waitReady(policy, READY_FOR_POLICY_MS, sinks.signal);
        sinks.say(
          `policy ${policy} (${target.strategy.name}, mode ${String(target.policy.mode)}) held by every agent; replaying`,
        );
        recording = await replayArrivals(
          {
            policy,
            mode: target.policy.mode ?? 'regional',
            arrivals,
            compression: plan.compression,
            regions: plan.regions,
            faults: scenarioFaults(plan.scenario, plan),
            binS: plan.settings.binS,
            durationS: plan.settings.durationS,
          },
          {
            decisions,
            stack: client,
            redis: session.endpoints.redis,
            signal: sinks.signal,
            died: session.died,
            progress: (p) => sinks.progress(p),
          },
        );
      } finally {
        if (!(await client.deletePolicy(policy))) sinks.say(`note: policy ${policy} could not be deleted`);
      }
      const spec = plan.predictions[i + 1]!;
      rows.push(predicted[i + 1]!);
      rows.push(
        realRow(
          {
            spec,
            compression: plan.compression,
            stack: session.kind,
            wallTiming: { ...plan.wall },
            roundTrips: plan.roundTrips,
          },
          recording,
        ),
      );
    }
  } finally {
    decisions.close();
    if (session.kind === 'started') {
      sinks.say('stopping the stack');
      await session.stop();
    }
  }
  const table = replayTable(rows);
  const written = writeReplay(
    outDir,
    `quotaplane replay: ${plan.scenario.name} on the real stack beside the simulator`,
    rows,
    table,
  );
  return { plan, rows, table, written };
}

function scenarioFaults(scenario: Scenario, plan: ReplayPlan) {
  return scenario.plan(plan.regions, plan.settings).faults;
}
