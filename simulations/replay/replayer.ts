/**
 * One strategy's replay: every arrival sent as `POST /v1/decisions` to the agent of its region at its compressed
 * time (scenario µs / K), each answer recorded with when it came back; meanwhile the issued shares are sampled
 * every chart bin, each Redis's key count every second, and the scenario's Redis failover injected on time. The
 * coordinator's and agents' counters are read before and after, for the control messages.
 *
 * The send loop sleeps until the next arrival is due and then sends everything due, so a late timer sends a small
 * batch rather than drifting; how late each request went out is recorded (`sendLagMs`).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { PolicyMode } from '../../core/policy/policy.js';
import { subjectName } from '../dynamic/subject-name.js';
import type { TimedFault } from '../scenario.js';
import type { Arrival } from './arrivals.js';
import type { DecisionClient } from './decision-client.js';
import { KeyCounter } from './key-counter.js';
import { sumOf } from './prometheus-text.js';
import type { AgentCounts, ControlCounts, RealAnswer, Recording, ShareSample } from './recording.js';
import { RedisFailover, type KeySnapshot } from './redis-failover.js';
import { ReplayError, ReplayInterrupted } from './replay-errors.js';
import type { StackClient } from './stack-client.js';

/** What the progress line shows, about once a second. */
export interface ReplayProgress {
  policy: string;
  wallMs: number;
  totalWallMs: number;
  sent: number;
  answered: number;
  admitted: number;
  total: number;
}

export interface ReplayRun {
  /** The policy's name on the stack (already created and ready on every agent). */
  policy: string;
  mode: PolicyMode;
  arrivals: readonly Arrival[];
  compression: number;
  regions: readonly string[];
  /** The scenario's faults (only `redis-failover` is replayed; the plan refuses scenarios with others). */
  faults: readonly TimedFault[];
  /** Scenario seconds of a chart bin: the shares are sampled that often. */
  binS: number;
  /** Scenario seconds of the run. */
  durationS: number;
}

export interface ReplayIo {
  decisions: DecisionClient;
  stack: StackClient;
  /** `redis://` URL of each region's Redis (undefined for a cluster region). */
  redis: readonly (string | undefined)[];
  signal: AbortSignal;
  /** Resolves when the stack stops on its own. */
  died: Promise<string>;
  progress: (p: ReplayProgress) => void;
}

/** Lead time between the first /metrics read and scenario time 0, wall ms. */
const START_LEAD_MS = 100;
const KEY_SAMPLE_MS = 1000;
const PROGRESS_MS = 1000;

async function controlSnapshot(stack: StackClient, regions: number) {
  const [coordinator, ...agents] = await Promise.all([
    stack.coordinatorMetrics(),
    ...Array.from({ length: regions }, (_, r) => stack.agentMetrics(r)),
  ]);
  return { at: performance.now(), coordinator, agents };
}
type ControlSnapshot = Awaited<ReturnType<typeof controlSnapshot>>;

/** Control messages between two snapshots (recording.ts ControlCounts says what each term is). */
export function controlCounts(
  before: Pick<ControlSnapshot, 'coordinator' | 'agents' | 'at'>,
  after: Pick<ControlSnapshot, 'coordinator' | 'agents' | 'at'>,
  agents: number,
): ControlCounts {
  const delta = (name: string, where: Record<string, string> = {}) =>
    sumOf(after.coordinator, name, where) - sumOf(before.coordinator, name, where);
  const agentDelta = (name: string) =>
    after.agents.reduce((n, samples, r) => n + sumOf(samples, name) - sumOf(before.agents[r] ?? [], name), 0);
  const loans = agentDelta('quotaplane_loan_requests_total') + agentDelta('quotaplane_loans_served_total');
  const kind = (k: string) => delta('quotaplane_protocol_messages_total', { kind: k });
  const heartbeat = kind('heartbeat');
  const usage = kind('usage');
  const ack = kind('ack');
  const bye = kind('bye');
  const recordWrites = delta('quotaplane_allocation_writes_total');
  const recordDeliveries = recordWrites * agents;
  return {
    heartbeat,
    usage,
    ack,
    bye,
    renewals: heartbeat,
    recordWrites,
    recordDeliveries,
    dropped: delta('quotaplane_protocol_messages_dropped_total'),
    loans,
    total: heartbeat + usage + ack + bye + heartbeat + 2 * recordWrites + recordDeliveries + loans,
    windowSeconds: (after.at - before.at) / 1000,
  };
}

/** The loan answers the agents count (core/borrowing/planner.ts LoanAnswer). */
const LOAN_ANSWERS = ['grant', 'refused', 'unreachable', 'timeout', 'late'] as const;

/** The agents' loan and Redis counters between two snapshots (recording.ts AgentCounts). */
export function agentCounts(
  before: Pick<ControlSnapshot, 'agents'>,
  after: Pick<ControlSnapshot, 'agents'>,
): AgentCounts {
  const delta = (name: string, where: Record<string, string> = {}) =>
    after.agents.reduce(
      (n, samples, r) => n + sumOf(samples, name, where) - sumOf(before.agents[r] ?? [], name, where),
      0,
    );
  const loanAnswers: Record<string, number> = {};
  for (const answer of LOAN_ANSWERS) {
    const n = delta('quotaplane_loan_requests_total', { answer });
    if (n > 0) loanAnswers[answer] = n;
  }
  return {
    loanAnswers,
    grantsDistrusted: delta('quotaplane_loan_grants_distrusted_total'),
    storeTimeouts: delta('quotaplane_store_latency_seconds_count', { outcome: 'timeout' }),
  };
}

function forwardedBetween(before: ControlSnapshot, after: ControlSnapshot): number {
  let n = 0;
  after.agents.forEach((samples, r) => {
    n +=
      sumOf(samples, 'quotaplane_forwarded_decisions_total') -
      sumOf(before.agents[r]!, 'quotaplane_forwarded_decisions_total');
  });
  return n;
}

/** Replay `run` against the stack; resolves with everything recorded, throws ReplayError/ReplayInterrupted. */
export async function replayArrivals(run: ReplayRun, io: ReplayIo): Promise<Recording> {
  const K = run.compression;
  const n = run.arrivals.length;
  const dueMs = (a: Arrival) => a.at / 1000 / K;
  const totalWallMs = (run.durationS * 1000) / K;
  const answers: (RealAnswer | undefined)[] = new Array<RealAnswer | undefined>(n);
  const lag = new Float64Array(n);
  const shares: ShareSample[] = [];
  const peakKeys = run.regions.map(() => 0);
  const faults: Recording['faults'] = [];
  let sent = 0;
  let answered = 0;
  let admitted = 0;
  let stopped: Error | undefined;
  let died = false;
  // Wakes every wait of this replay at once: Ctrl-C, a dead stack, or the end.
  const wake = new AbortController();
  const pause = (ms: number) => sleep(ms, undefined, { signal: wake.signal }).catch(() => undefined);
  // Once woken, a pause returns at once: the sampling loops must stop then, not spin on microtasks and starve the
  // answers still in flight (and Ctrl-C's cleanup) of the event loop.
  const sampling = () => !finished && !wake.signal.aborted;
  const onAbort = () => wake.abort();
  io.signal.addEventListener('abort', onAbort, { once: true });
  void io.died.then((text) => {
    died = true;
    stopped ??= new ReplayError(`the stack stopped during the replay: ${text}`);
    wake.abort();
  });
  const halt = () =>
    stopped ?? (io.signal.aborted ? new ReplayInterrupted(String(io.signal.reason)) : undefined);

  const before = await controlSnapshot(io.stack, run.regions.length);
  const keyCounter = new KeyCounter(io.redis);
  const failovers = new Map<number, RedisFailover>();
  for (const { fault } of run.faults) {
    if (fault.kind !== 'redis-failover') continue;
    const url = io.redis[fault.region];
    if (url === undefined)
      throw new ReplayError(
        `redis-failover needs a single Redis in region ${run.regions[fault.region]!} (it runs on a cluster)`,
      );
    failovers.set(fault.region, new RedisFailover(url, run.policy));
  }

  const t0 = performance.now() + START_LEAD_MS;
  const wallNow = () => performance.now() - t0;
  let finished = false;
  const background: Promise<unknown>[] = [];

  // Issued shares, every chart bin (regional policies only: the others have no allocation).
  if (run.mode === 'regional') {
    const everyMs = Math.max(50, (run.binS * 1000) / K);
    background.push(
      (async () => {
        while (sampling()) {
          const at = wallNow();
          const s = await io.stack.issuedShares(run.policy, run.regions).catch(() => undefined);
          if (s !== undefined) shares.push({ atMs: Math.max(0, at), shares: s });
          await pause(Math.max(0, everyMs - (wallNow() - at)));
        }
      })(),
    );
  }
  background.push(
    (async () => {
      while (sampling()) {
        const counts = await keyCounter.count();
        counts.forEach((c, r) => (peakKeys[r] = Math.max(peakKeys[r]!, c ?? 0)));
        await pause(KEY_SAMPLE_MS);
      }
    })(),
  );
  background.push(
    (async () => {
      while (sampling()) {
        io.progress({
          policy: run.policy,
          wallMs: Math.max(0, wallNow()),
          totalWallMs,
          sent,
          answered,
          admitted,
          total: n,
        });
        await pause(PROGRESS_MS);
      }
    })(),
  );

  // The scenario's failover: a snapshot failoverLagS before it, then the replica takes over.
  const faultWork: Promise<void>[] = [];
  for (const { atS, fault } of run.faults) {
    if (fault.kind !== 'redis-failover') continue;
    const failover = failovers.get(fault.region)!;
    const snapshotAt = fault.reset === 'snapshot' ? Math.max(0, atS - fault.lostWritesS) : undefined;
    faultWork.push(
      (async () => {
        let snapshot: KeySnapshot | undefined;
        if (snapshotAt !== undefined) {
          await pause(Math.max(0, (snapshotAt * 1000) / K - wallNow()));
          if (halt() !== undefined) return;
          snapshot = await failover.snapshot();
        }
        await pause(Math.max(0, (atS * 1000) / K - wallNow()));
        if (halt() !== undefined) return;
        faults.push({ kind: fault.kind, atMs: wallNow() });
        await failover.failover(snapshot);
      })().catch((error: unknown) => {
        // Kept, not thrown: the send loop goes on until it looks, and a rejection nobody awaits yet would crash.
        stopped ??= new ReplayError(
          `redis-failover in ${run.regions[fault.region]!} failed: ${error instanceof Error ? error.message : String(error)}`,
          { cause: error },
        );
        wake.abort();
      }),
    );
  }

  const inFlight = new Set<Promise<void>>();
  const send = (index: number) => {
    const arrival = run.arrivals[index]!;
    const sentMs = wallNow();
    lag[index] = Math.max(0, sentMs - dueMs(arrival));
    const body = JSON.stringify({
      policy: run.policy,
      subject: subjectName(arrival.subject),
      cost: arrival.cost,
    });
    sent++;
    const p = io.decisions.decide(arrival.region, body).then((a) => {
      answers[index] = { sentMs, answeredMs: wallNow(), ...a };
      answered++;
      if (a.allowed) admitted++;
      inFlight.delete(p);
    });
    inFlight.add(p);
  };

  let next = 0;
  try {
    await pause(Math.max(0, -wallNow()));
    while (next < n && halt() === undefined) {
      const now = wallNow();
      while (next < n && dueMs(run.arrivals[next]!) <= now) send(next++);
      if (next < n) await pause(Math.max(0, dueMs(run.arrivals[next]!) - wallNow()));
    }
    // Answers time out by themselves (decision-client.ts); a dead stack ends them with errors.
    while (inFlight.size > 0) await Promise.all([...inFlight]);
    await Promise.all(faultWork);
  } finally {
    finished = true;
    wake.abort();
    io.signal.removeEventListener('abort', onAbort);
    await Promise.allSettled(background);
    await keyCounter.close();
    for (const f of failovers.values()) await f.close();
  }
  const problem = halt();
  if (problem !== undefined) throw problem;
  io.progress({ policy: run.policy, wallMs: wallNow(), totalWallMs, sent, answered, admitted, total: n });

  const wallSeconds = wallNow() / 1000;
  const after = died ? undefined : await controlSnapshot(io.stack, run.regions.length);
  const complete = answers.map((a, i) => {
    if (a === undefined) throw new ReplayError(`arrival ${i} got no answer recorded`);
    return a;
  });
  return {
    policy: run.policy,
    arrivals: run.arrivals,
    answers: complete,
    shares,
    peakKeys: Object.fromEntries(run.regions.map((r, i) => [r, peakKeys[i]!])),
    control: after === undefined ? undefined : controlCounts(before, after, run.regions.length),
    agents: after === undefined ? undefined : agentCounts(before, after),
    forwarded: after === undefined ? 0 : forwardedBetween(before, after),
    wallSeconds,
    sendLagMs: lag.sort(),
    faults,
  };
}
