/**
 * The conservation property suite, integration tier (issue 25; docs/design.md "Conservation property suite"): a
 * sampled set of the generated cases (test/helpers/conservation-cases.ts) on the real stack: three regions, one
 * agent and one Redis each, the coordinator and real NATS, borrowing on. Shares move as the coordinator's
 * rebalancer moves them (the generated moves are its to make here); restarts stop an agent and start a new one;
 * freezes SIGSTOP a region's Redis; a lease lapse drops the region's heartbeats on their way to the coordinator
 * (nothing else of its NATS link: it still lends, forwards and reads records) until its agent has settled at the
 * safe share, and its stall SIGSTOPs the NATS server while loans are in flight. NATS cuts (one NATS server serves
 * every region here) and reservations are left to the unit tier. Clock jumps become short real waits. The global
 * checker takes the widest window the real times allow; the shares every agent decides with are summed at every
 * change (test/harness/conservation-checker.ts).
 *
 * A second sample draws cases that each hold a lapse (`arbitraryCase(…, { lapse: true })`), so the lapse is run
 * whatever the first sample draws: `QP_PROPERTY_LAPSE_RUNS` of them (default 4, about 40 s: each lapse waits out
 * the lease and the grace, 5.5 s here).
 *
 * A third sample draws term cases (`arbitraryCase(…, { terms: true })`): `QP_PROPERTY_TERM_RUNS` of them (default
 * 3, about 40-50 s). The agents give terms (`QP_TERMS=on`, `QP_TERM_MS` = `QP_PROPERTY_TERM_MS`, default 1,000),
 * and every agent has a direct client (`AgentClient` with `direct`, on the region's Redis): calls marked `direct`
 * go through it, and in a term case each region's clients decide `p0`'s subject `a` every 100 ms throughout (the
 * same flow everywhere, so it moves no share by itself; frequent enough to keep a term held). Each case holds a
 * lapse of one region and a crash of its agent right after a lean away from it moved its share (a shrink, which
 * its terms keep unacknowledged for up to a term): the agent's NATS connection closes (no goodbye), its HTTP
 * answers 503, its successor takes its instance name, and its clients keep deciding under the terms they hold (the
 * successor's own clients come once those have run out). What the clients decide counts as any answer (its
 * allowed flag); every term the agents give counts in the checker as a share in force of its region until it has
 * run out (validity + TERM_MARGIN_MS), whatever the agent acknowledges or whether it still runs. `p0` holds 60-126
 * tokens in term cases, so the clients take tokens ahead of the flow (docs/agent.md, "Direct decisions") and hand
 * back what they do not spend; an admission on such a token counts from when its take was sent (the answer's
 * `aheadMs`), the instant it left the bucket. The sample fails unless clients decided under terms in every case,
 * spent tokens taken ahead, and every case crashed an agent; how often a client decided
 * under the crashed agent's term once the successor had started is logged (it depends on the machine's speed).
 *
 * What it catches (seed 25): a term not held in the share view (term-issuer.ts without `holds.hold`) at the first
 * shrink under a term (shares in force summed above 1); a successor that does not wait for its predecessor's
 * recorded terms (regional-agent/terms/terms-until.ts `waitForRecordMs` answering 0: its first heartbeat and its
 * acknowledgements come at once), at a crash in a pending shrink (shares summed to 1.05 and 1.10). Before the
 * record, the heartbeat's delay and the restart hold were two fixed waits, each covering for the other here, so
 * neither alone failed the sample. A direct client that spends a token taken ahead without counting it down
 * (direct.ts `#spend`) fails the first term case: 79 of `p0`'s admissions in 1.3 s, above 72 + 5·1.3. The
 * admission windows alone caught none of the term and restart mistakes above: an over-admission needs the
 * grown regions' buckets to refill into the room within the term, which a few tokens a second do not.
 */
import fc from 'fast-check';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ownValue } from '../../../core/own-keys.js';
import type { DecisionRequest, DecisionResponse } from '../../../core/wire/agent.js';
import { MIN_TERM_MS } from '../../../core/wire/term.js';
import { AgentClient } from '../../../packages/client/src/index.js';
import { TERM_MARGIN_MS } from '../../../regional-agent/terms/term-holds.js';
import { OPEN_CREDENTIAL_TAG, protocolSubjects } from '../../../core/wire/protocol.js';
import { ConservationChecker } from '../../harness/conservation-checker.js';
import {
  answerLost,
  arbitraryCase,
  type Call,
  callBody,
  type Case,
  conservationViolations,
  newRecord,
  policyBody,
  type PolicySpec,
  recordAnswer,
  type Region,
  REGIONS,
  unadmittedReplays,
} from '../../helpers/conservation-cases.js';
import { metricTotal } from '../../helpers/decision-load.js';
import { eventually, startStack, type ServiceAgent, type ServiceStack } from '../../helpers/fixture/index.js';

const SAMPLE = Number(process.env['QP_PROPERTY_STACK_RUNS'] ?? 10);
const LAPSE_SAMPLE = Number(process.env['QP_PROPERTY_LAPSE_RUNS'] ?? 4);
const SEED = Number(process.env['QP_PROPERTY_SEED'] ?? 25);
const TERM_SAMPLE = Number(process.env['QP_PROPERTY_TERM_RUNS'] ?? 3);
/** The agents' QP_TERM_MS: how long a term lasts at most (and how long a restarted agent waits to heartbeat). */
const TERM_MS = Number(process.env['QP_PROPERTY_TERM_MS'] ?? 1000);
/** How often a term case's flow sends one direct check through each direct client of its region, ms. */
const FLOW_MS = 100;
/**
 * How long a lapse step's stall holds the NATS server: longer than a borrower waits for its lenders (the
 * decision deadline, 1,500 ms here, less the store timeout), so grants lent before it arrive after their borrow
 * gave up.
 */
const STALL_MS = 1400;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The case with its policies renamed for run `n` (each run has policies of its own on the shared stack). */
function renamed(c: Case, n: string): Case {
  const name = (p: string) => `c${n}-${p}`;
  const calls = (list: Call[]) =>
    list.map((call) => ({ ...call, checks: call.checks.map((k) => ({ ...k, policy: name(k.policy) })) }));
  return {
    policies: c.policies.map((p) => ({ ...p, name: name(p.name) })),
    borrowing: true,
    steps: c.steps.map((s) =>
      s.op === 'traffic'
        ? { ...s, calls: calls(s.calls) }
        : s.op === 'lapse'
          ? { ...s, calls: calls(s.calls), lean: s.lean === undefined ? undefined : calls([s.lean])[0] }
          : s.op === 'move'
            ? { ...s, policy: name(s.policy) }
            : s.op === 'restart' && s.lean !== undefined
              ? { ...s, lean: calls(s.lean) }
              : s,
    ),
    terms: c.terms,
  };
}

/** What the lapse steps came to, over a sample: a lapse proves little if nobody borrowed from the lapsed region. */
interface LapseTally {
  steps: number;
  /** Tokens the lapsed regions lent while settled at their safe shares. */
  lent: number;
  /** Late grants credited by the borrowers (quotaplane_loan_grants_late_total). */
  lateGrants: number;
  /**
   * Grants the borrowers believed only in part or not at all (quotaplane_loan_grants_distrusted_total): a lapsed
   * lender's grant is believed up to its safe share within the room the others' held shares leave.
   */
  distrusted: number;
  /** Steps during which a borrower's share epoch of a case policy moved (a rebalance during the lapse). */
  epochMoved: number;
  /** Steps whose lean moved the lender's share before its lapse. */
  leaned: number;
  stalls: number;
}

const newTally = (): LapseTally => ({
  steps: 0,
  lent: 0,
  lateGrants: 0,
  distrusted: 0,
  epochMoved: 0,
  leaned: 0,
  stalls: 0,
});

/** What the term cases came to: a case in which no client decided under a term proves nothing about terms. */
interface TermTally {
  /** Checks decided on Redis under a term per case (admitted, refused, and refusals sent on to the agent). */
  perCase: number[];
  /** Of those, admitted. */
  admitted: number;
  /** Of those, admitted on tokens a client took ahead (`directStats().grants.spent`), with no script call. */
  spentAhead: number;
  /** Terms the agents gave (each counted by the checker as a share in force until it ran out). */
  terms: number;
  crashes: number;
  /** Leans before a crash that moved the crashed region's share. */
  leaned: number;
  /** Crashes after which a client still decided under a term of the crashed agent once its successor had started. */
  acrossRestart: number;
}

const newTermTally = (): TermTally => ({
  perCase: [],
  admitted: 0,
  spentAhead: 0,
  terms: 0,
  crashes: 0,
  leaned: 0,
  acrossRestart: 0,
});

/** A direct client of one agent (`AgentClient` with `direct`) and its own connection to the region's Redis. */
interface Direct {
  client: AgentClient;
  redis: Redis;
  agent: ServiceAgent;
}

/**
 * Checks a direct client decided under a term: on Redis (an admission, a refusal, or a refusal sent on), or from a
 * remembered refusal (none here: borrowing is on, so no refusal is final).
 */
function decidedDirectly(d: Direct): number {
  const s = d.client.directStats()!;
  return s.admitted + s.refused + s.toAgent.refused;
}

/** Direct decisions and admissions so far, of the open clients and (`closed`) of those closed before. */
function directTotals(
  open: Iterable<readonly Direct[]>,
  closed: { decided: number; admitted: number; spentAhead: number },
): { decided: number; admitted: number; spentAhead: number } {
  const sum = { ...closed };
  for (const list of open)
    for (const d of list) {
      sum.decided += decidedDirectly(d);
      sum.admitted += d.client.directStats()!.admitted;
      sum.spentAhead += d.client.directStats()!.grants.spent;
    }
  return sum;
}

describe('conservation on the real stack (sampled cases)', () => {
  let stack: ServiceStack;
  /** Σ shares in force ≤ 1 at every change, over every agent the stack ran. */
  const checker = new ConservationChecker();
  /** Regions whose heartbeats are dropped (lapse steps). */
  const lapsed = new Set<string>();
  const instrumented = new WeakSet<ServiceAgent>();
  let poll: NodeJS.Timeout | undefined;
  let paused = false;

  const leaseOf = (a: ServiceAgent) => a.running.coordination!.holder.lease;
  /** Direct clients by region, newest last (a crashed agent's stay until the case ends). */
  const directs = new Map<string, Direct[]>();
  /** Closes of crashed agents (each waits for its terms to run out). */
  const crashed: Promise<unknown>[] = [];
  /** What the direct clients closed so far decided. */
  const closedTotals = { decided: 0, admitted: 0, spentAhead: 0 };

  function openDirect(a: ServiceAgent): void {
    const redis = new Redis(stack.region(a.region).redis.url, { maxRetriesPerRequest: 1 });
    // The failure mode stays `closed`: an answer the agent did not give admits nothing.
    const client = new AgentClient({ baseUrl: a.url, timeoutMs: 2000, direct: { redis } });
    directs.set(a.region, [...(directs.get(a.region) ?? []), { client, redis, agent: a }]);
  }

  function closeDirect(d: Direct): void {
    closedTotals.decided += decidedDirectly(d);
    closedTotals.admitted += d.client.directStats()!.admitted;
    closedTotals.spentAhead += d.client.directStats()!.grants.spent;
    d.client.close();
    d.redis.disconnect();
    directs.set(
      d.agent.region,
      (directs.get(d.agent.region) ?? []).filter((x) => x !== d),
    );
  }

  /**
   * Watch an agent's shares in force, and drop its heartbeats while its region is lapsed: the request is lost on
   * the way (it times out as an unanswered one does), and nothing else the agent sends is touched.
   */
  function instrument(a: ServiceAgent): void {
    if (instrumented.has(a)) return;
    instrumented.add(a);
    const { nc, holder } = a.running.coordination!;
    checker.watch(holder.agentId, a.region, holder.lease);
    // A term is a share in force of its region until it has run out, whatever the agent that gave it acknowledges
    // meanwhile and whether or not it still runs: the checker counts each one (term-issuer.ts reads the share it
    // sizes a term with through `defaultShare`, which nothing else calls, and bounds it by `stableForMs`).
    const lease = holder.lease;
    const defaultShare = lease.defaultShare.bind(lease);
    lease.defaultShare = (policy) => {
      const share = defaultShare(policy);
      const validForMs = share === undefined ? 0 : Math.floor(Math.min(TERM_MS, lease.stableForMs(policy)));
      if (share !== undefined && validForMs >= MIN_TERM_MS)
        checker.holdTerm(a.region, policy, share.share, validForMs + TERM_MARGIN_MS, Date.now());
      return share;
    };
    const heartbeat = protocolSubjects(stack.namespace, OPEN_CREDENTIAL_TAG).heartbeat(a.region);
    const request = nc.request.bind(nc);
    nc.request = async (subject, payload, opts) => {
      if (subject === heartbeat && lapsed.has(a.region)) {
        await sleep(opts?.timeout ?? 1000);
        throw new Error(`TIMEOUT: the heartbeat of ${a.region} was lost (lapse step)`);
      }
      return request(subject, payload, opts);
    };
  }

  async function stopAgent(a: ServiceAgent): Promise<void> {
    checker.unwatch(a.running.coordination!.holder.agentId);
    for (const d of directs.get(a.region) ?? []) if (d.agent === a) closeDirect(d);
    await stack.stopAgent(a);
  }

  /**
   * A crash: the agent vanishes without a goodbye and without waiting for its terms (its NATS connection is
   * closed first, so nothing more reaches the coordinator; its HTTP answers 503 from now on). Its clients keep
   * deciding under the terms they hold. Its close goes on in the background, as the process's death would.
   */
  async function crash(a: ServiceAgent): Promise<void> {
    checker.unwatch(a.running.coordination!.holder.agentId);
    await a.running.coordination!.nc.close();
    crashed.push(stack.stopAgent(a).catch(() => undefined));
  }

  /** Heartbeats of `region` get through again: wait until its agents hold a renewed lease. */
  async function heal(region: string): Promise<void> {
    lapsed.delete(region);
    await eventually(
      () => stack.inRegion(region).every((a) => leaseOf(a).mode() === 'valid'),
      20_000,
      `a renewed lease in ${region} after its lapse`,
      50,
    );
  }

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      agent: {
        borrowing: true,
        decisionDeadlineMs: 1500,
        storeTimeoutMs: 300,
        breakerResetMs: 200,
        // Terms for the direct clients (given only to those that ask: the calls marked `direct` and the term
        // cases' flows).
        terms: 'on',
        termMs: TERM_MS,
      },
    });
    for (const a of stack.agents) {
      instrument(a);
      openDirect(a);
    }
    // Leases lapse and settle with time alone: look often, so the checker sees each change when it happens.
    poll = setInterval(() => {
      for (const a of stack.agents) leaseOf(a).poll();
    }, 20);
  }, 60_000);

  afterAll(async () => {
    clearInterval(poll);
    for (const list of directs.values()) for (const d of [...list]) closeDirect(d);
    await Promise.all(crashed);
    if (paused) await stack?.nats.resume().catch(() => undefined);
    for (const r of stack?.redis.values() ?? []) await r.resume().catch(() => undefined);
    await stack?.[Symbol.asyncDispose]();
  });

  /** Every agent holds a share of each regional policy (a lease), so nothing is decided by `no_lease`. */
  async function leased(policies: readonly PolicySpec[]): Promise<void> {
    // Bounded waits, generous for a CI machine whose two cores the other files share (15 s once ran out there).
    await stack.ready(
      policies.map((p) => p.name),
      30_000,
    );
    const names = policies.filter((p) => p.mode === 'regional').map((p) => p.name);
    await eventually(
      () =>
        stack.agents.every((a) =>
          names.every((p) => a.running.coordination?.shares.shareFor(p, 'a') !== undefined),
        ),
      30_000,
      'a lease for the case policies',
      50,
    );
  }

  async function run(c: Case, tally: LapseTally, termTally = newTermTally()): Promise<string[]> {
    const specs = new Map<string, PolicySpec>(c.policies.map((p) => [p.name, p]));
    for (const p of c.policies) await stack.putPolicy(p.name, policyBody(p));
    await leased(c.policies);
    const record = newRecord();
    const sharesBefore = checker.violations.length;
    // Any fault so far in the case: the breaker and leases take a moment to recover after a thaw or a restart.
    let faulted = false;
    const frozen = new Set<string>();

    /**
     * One call through a direct client, its answer recorded as an agent's is (the answer's allowed flag): decided
     * on Redis under a term where it can be, at the agent otherwise.
     */
    const viaClient = async (d: Direct, call: Call, region: Region, failing: boolean): Promise<void> => {
      const sentAt = Date.now();
      let answer: Parameters<typeof recordAnswer>[3];
      try {
        const decision = await d.client.decide(callBody(call) as DecisionRequest);
        if (decision.degraded !== undefined) {
          // The client's failure mode (closed) answered: the agent may have decided all the same.
          if (decision.allowed)
            record.problems.push(`a direct client's failure mode admitted: ${JSON.stringify(decision)}`);
          answer = { error: `degraded: ${decision.degraded}`, lost: true };
        } else {
          const results = decision.results as DecisionResponse['results'];
          answer = {
            ...decision,
            results,
            lost: answerLost(200, decision as { results?: { cause?: string }[] }),
          };
        }
      } catch (error) {
        // A 4xx (a hostile class, a cost above the policy's): refused, nothing admitted.
        answer = { error: (error as { code?: string }).code ?? String(error), lost: false };
      }
      // Admitted on a token taken ahead: decided when its take left, up to a horizon earlier (the window the
      // checker takes starts there).
      const ahead =
        answer !== undefined && 'aheadMs' in answer ? (answer.aheadMs as number | undefined) : undefined;
      recordAnswer(record, specs, call, answer, Date.now(), failing, region, sentAt - (ahead ?? 0));
    };

    /** The calls, all at once from each of their regions, each answer recorded. */
    const send = (calls: readonly Call[]): Promise<unknown> => {
      const failing = faulted;
      return Promise.all(
        calls.flatMap((call) =>
          call.regions.flatMap((region) =>
            Array.from({ length: call.repeat }, async () => {
              const direct = call.direct === true ? directs.get(region)?.at(-1) : undefined;
              if (direct !== undefined) return viaClient(direct, call, region, failing);
              const url = stack.inRegion(region)[0]!.url;
              const sentAt = Date.now();
              const res = await fetch(`${url}/v1/decisions`, {
                method: 'POST',
                headers: { 'content-type': 'application/json' },
                body: JSON.stringify(callBody(call)),
              });
              const body = (await res.json()) as { code?: string; results?: { cause?: string }[] };
              // A timed-out store call or forward may have been decided all the same: a retry of the
              // same call may then replay it (the replay check counts it as possibly admitted).
              const lost = answerLost(res.status, body);
              const answer =
                res.status === 200
                  ? { ...(body as object as DecisionResponse), lost }
                  : { error: body.code ?? String(res.status), lost };
              if (res.status >= 500 && res.status !== 503)
                record.problems.push(`${res.status} ${JSON.stringify(body)}`);
              recordAnswer(record, specs, call, answer, Date.now(), failing, region, sentAt);
            }),
          ),
        ),
      );
    };

    /** Sum a metric over the agents of some regions now. */
    const total = async (regions: readonly string[], name: string): Promise<number> => {
      let sum = 0;
      for (const a of stack.agents) if (regions.includes(a.region)) sum += await metricTotal(a.url, name);
      return sum;
    };

    /** Calls in flight the steps do not wait for (the flow's, an eager lean's): awaited at the end of the case. */
    const flowing = new Set<Promise<unknown>>();

    /**
     * Bursts of `calls` until the rebalancer moved `region`'s share (2 s of it confirm a move here), at most
     * `rounds` of them; whether it moved. `eager`: a burst every 200 ms whether or not the last one was answered
     * (they are awaited with the flow's), looking every 5 ms, so that what follows comes within a few ms of the
     * record that moved it; otherwise each burst answered before the next, looking every 20 ms.
     */
    const lean = async (calls: Call[], region: string, rounds = 25, eager = false): Promise<boolean> => {
      const policy = calls[0]!.checks[0]!.policy;
      const viewer = () => stack.inRegion(region)[0] ?? stack.agents[0]!;
      const issued = () => ownValue(leaseOf(viewer()).regionShares(policy, 'a'), region) ?? 0;
      const start = issued();
      const moved = () => Math.abs(issued() - start) >= 0.01;
      if (eager) {
        for (let i = 0; i < rounds && !moved(); i++) {
          const sent: Promise<unknown> = send(calls).finally(() => flowing.delete(sent));
          flowing.add(sent);
          for (let t = 0; t < 40 && !moved(); t++) await sleep(5);
        }
        return moved();
      }
      for (let i = 0; i < rounds && !moved(); i++) {
        await send(calls);
        for (let t = 0; t < 10 && !moved(); t++) await sleep(20);
      }
      return moved();
    };

    const directBefore = directTotals(directs.values(), closedTotals);
    const termsBefore = checker.terms;
    const retired: Direct[] = [];

    // A term case: `p0`'s subject `a` decided directly in every region throughout (the same light flow in each,
    // so that it moves no share by itself), through every direct client of the region (a crashed agent's too,
    // while its terms hold): whichever region's share shrinks, terms of it are out.
    let flow: NodeJS.Timeout | undefined;
    if (c.terms !== undefined) {
      const policy = c.policies[0]!.name;
      flow = setInterval(() => {
        for (const region of REGIONS) {
          const call: Call = {
            regions: [region],
            checks: [{ policy, subject: 'a', cost: 1 }],
            dryRun: false,
            repeat: 1,
            direct: true,
          };
          for (const d of directs.get(region) ?? []) {
            const sent = viaClient(d, call, region, faulted).finally(() => flowing.delete(sent));
            flowing.add(sent);
          }
        }
      }, FLOW_MS);
    }

    try {
      for (const step of c.steps) {
        if (step.op === 'traffic') {
          for (let round = 0; round < step.rounds; round++) {
            if (round > 0) await sleep(Math.min(step.gapMs, 300));
            await send(step.calls);
          }
        } else if (step.op === 'advance') {
          await sleep(Math.min(step.ms, 300));
        } else if (step.op === 'freeze') {
          const redis = stack.region(step.region).redis;
          if (step.on) {
            faulted = true;
            frozen.add(step.region);
            await redis.pause();
          } else if (frozen.delete(step.region)) await redis.resume();
        } else if (step.op === 'restart') {
          faulted = true;
          // An agent cannot start on a frozen Redis: the restart thaws it first.
          if (frozen.delete(step.region)) await stack.region(step.region).redis.resume();
          // A new agent's heartbeats get through: the restart ends a lapse.
          lapsed.delete(step.region);
          const [agent] = stack.inRegion(step.region);
          if (step.lean !== undefined && agent !== undefined && frozen.size === 0) {
            // A shrink of the region's share, which its terms hold unacknowledged for a while: crash in it.
            if (await lean(step.lean, step.region, 12, true)) termTally.leaned++;
          }
          if (step.crash === true && agent !== undefined) {
            termTally.crashes++;
            const old = [...(directs.get(step.region) ?? [])];
            const crashedAt = Date.now();
            await crash(agent);
            // The successor takes the crashed agent's instance name, as a restarted process does.
            const successor = await stack.startAgent(step.region, agent.instance);
            const atStart = old.map(decidedDirectly);
            instrument(successor);
            retired.push(...old);
            if (frozen.size === 0) await leased(c.policies);
            // The successor's clients come once the crashed agent's terms have run out: its own terms would hold
            // its acknowledgements back, and with them the grows an early settlement of the crashed agent's
            // shrinks lets the coordinator give the others.
            await sleep(TERM_MS + TERM_MARGIN_MS - (Date.now() - crashedAt));
            openDirect(successor);
            // A client of the crashed agent decided under its term after the successor had started.
            if (old.some((d, i) => decidedDirectly(d) > atStart[i]!)) termTally.acrossRestart++;
          } else {
            if (agent !== undefined) await stopAgent(agent);
            const successor = await stack.startAgent(step.region);
            instrument(successor);
            openDirect(successor);
            if (frozen.size === 0) await leased(c.policies);
          }
        } else if (step.op === 'lapse') {
          const lender = step.region;
          const borrowers = REGIONS.filter((r) => r !== lender);
          const regional = c.policies.filter((p) => p.mode === 'regional').map((p) => p.name);
          const epochs = () =>
            stack.agents
              .filter((a) => a.region !== lender)
              .flatMap((a) => regional.map((p) => leaseOf(a).shareFor(p, 'a')?.epoch))
              .join();
          const epochsBefore = epochs();
          if (!lapsed.has(lender)) {
            // Demand on one side until the rebalancer moved the lender's share.
            if (step.lean !== undefined && (await lean([step.lean], lender))) tally.leaned++;
            lapsed.add(lender);
            // Lease (1.5 s) and grace (4 s) run out: the agent decides and lends at its safe share.
            await eventually(
              () => stack.inRegion(lender).every((a) => leaseOf(a).mode() === 'settled'),
              20_000,
              `${lender} settled at its safe share`,
              50,
            );
          }
          const lentBefore = await total([lender], 'quotaplane_lent_tokens_total');
          const lateBefore = await total(borrowers, 'quotaplane_loan_grants_late_total');
          const distrustedBefore = await total(borrowers, 'quotaplane_loan_grants_distrusted_total');
          let stall: Promise<void> | undefined;
          for (let round = 0; round < step.rounds; round++) {
            if (round > 0) await sleep(Math.min(step.gapMs, 300));
            if (round === 0 && step.stallAfterMs !== undefined) {
              faulted = true;
              tally.stalls++;
              const after = step.stallAfterMs;
              stall = (async () => {
                await sleep(after);
                paused = true;
                await stack.nats.pause();
                await sleep(STALL_MS);
                await stack.nats.resume();
                paused = false;
              })();
            }
            await send(step.calls);
          }
          await stall;
          tally.steps++;
          tally.lent += (await total([lender], 'quotaplane_lent_tokens_total')) - lentBefore;
          tally.lateGrants += (await total(borrowers, 'quotaplane_loan_grants_late_total')) - lateBefore;
          tally.distrusted +=
            (await total(borrowers, 'quotaplane_loan_grants_distrusted_total')) - distrustedBefore;
          if (epochs() !== epochsBefore) tally.epochMoved++;
          if (step.heal) await heal(lender);
        }
        // 'move': the rebalancer moves shares on the real stack; 'cut' and 'reserve': left to the unit tier.
      }
    } finally {
      clearInterval(flow);
      await Promise.all(flowing);
      for (const d of retired) closeDirect(d);
      const directAfter = directTotals(directs.values(), closedTotals);
      termTally.perCase.push(directAfter.decided - directBefore.decided);
      termTally.admitted += directAfter.admitted - directBefore.admitted;
      termTally.spentAhead += directAfter.spentAhead - directBefore.spentAhead;
      termTally.terms += checker.terms - termsBefore;
      if (paused) {
        await stack.nats.resume();
        paused = false;
      }
      for (const r of frozen) await stack.region(r).redis.resume();
      // The next case starts with every lease renewed.
      for (const r of [...lapsed]) await heal(r);
    }
    const shares = checker.violations
      .slice(sharesBefore)
      .map((v) => `shares in force summed above 1: ${JSON.stringify(v)}`);
    return [
      ...record.problems,
      ...unadmittedReplays(record),
      ...shares,
      ...conservationViolations(c.policies, record.charges),
    ];
  }

  it(`holds every kind's bound on ${SAMPLE} sampled cases (seed ${SEED})`, async () => {
    const cases = fc.sample(arbitraryCase(8), { numRuns: SAMPLE, seed: SEED });
    expect(REGIONS).toEqual(stack.regions);
    const tally = newTally();
    for (const [n, c] of cases.entries()) {
      const found = await run(renamed(c, String(n)), tally);
      expect(found, JSON.stringify(renamed(c, String(n)))).toEqual([]);
    }
  }, 180_000);

  // A lender lapsed past its grace lends from its safe share; a borrower believes it only within the room the
  // others' held shares leave (core/lease/agent-lease.ts regionCeilings); a grant that arrives after its borrow
  // stopped waiting is credited only under the share epoch it was asked under (regional-agent/borrowing/borrower.ts).
  it(`holds every kind's bound with a lender lapsed past its grace, ${LAPSE_SAMPLE} sampled cases (seed ${SEED})`, async () => {
    const cases = fc.sample(arbitraryCase(6, { lapse: true }), { numRuns: LAPSE_SAMPLE, seed: SEED });
    const tally = newTally();
    for (const [n, c] of cases.entries()) {
      const found = await run(renamed(c, `l${n}`), tally);
      expect(found, JSON.stringify(renamed(c, `l${n}`))).toEqual([]);
    }
    // What the lapses came to (late grants and epoch moves depend on timing; they are reported, not required).
    console.log(`lapse steps: ${JSON.stringify(tally)}`);
    expect(tally.steps).toBeGreaterThanOrEqual(LAPSE_SAMPLE);
    // Someone borrowed from a settled lender: the lapse was exercised, not only waited out.
    expect(tally.lent).toBeGreaterThan(0);
  }, 180_000);

  // Terms out while shares move, a lease lapses and an agent crashes (docs/agent.md "Direct decisions"): each
  // term is a share in force of its region until it has run out (the checker counts it so), and what the clients
  // decide under terms is counted as any admission.
  it(`holds every kind's bound with terms out across a shrink, a lapse and a crash, ${TERM_SAMPLE} sampled cases (seed ${SEED})`, async () => {
    const cases = fc.sample(arbitraryCase(3, { terms: true }), { numRuns: TERM_SAMPLE, seed: SEED });
    const tally = newTally();
    const terms = newTermTally();
    for (const [n, c] of cases.entries()) {
      const found = await run(renamed(c, `t${n}`), tally, terms);
      expect(found, JSON.stringify(renamed(c, `t${n}`))).toEqual([]);
    }
    console.log(`term cases: ${JSON.stringify(terms)}; their lapse steps: ${JSON.stringify(tally)}`);
    // Not vacuous: clients decided under terms in every case, and every case crashed an agent that had given
    // terms (the checker counts each term a share in force until it ran out, whether or not a client still used
    // it). Whether a client still decided under a crashed agent's term after its successor started depends on how
    // fast the successor starts on this machine (the log above says how often): reported, not asserted.
    expect(terms.perCase.every((n) => n > 0)).toBe(true);
    expect(terms.terms).toBeGreaterThan(0);
    // Tokens were taken ahead and spent (p0's bucket is large enough in term cases), each admission counted from
    // its take.
    expect(terms.spentAhead).toBeGreaterThan(0);
    expect(terms.crashes).toBe(TERM_SAMPLE);
  }, 180_000);
});
