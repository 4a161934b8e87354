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
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ownValue } from '../../../core/own-keys.js';
import type { DecisionResponse } from '../../../core/wire/agent.js';
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
  REGIONS,
  unadmittedReplays,
} from '../../helpers/conservation-cases.js';
import { metricTotal } from '../../helpers/decision-load.js';
import { eventually, startStack, type ServiceAgent, type ServiceStack } from '../../helpers/fixture/index.js';

const SAMPLE = Number(process.env['QP_PROPERTY_STACK_RUNS'] ?? 10);
const LAPSE_SAMPLE = Number(process.env['QP_PROPERTY_LAPSE_RUNS'] ?? 4);
const SEED = Number(process.env['QP_PROPERTY_SEED'] ?? 25);
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
            : s,
    ),
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

  /**
   * Watch an agent's shares in force, and drop its heartbeats while its region is lapsed: the request is lost on
   * the way (it times out as an unanswered one does), and nothing else the agent sends is touched.
   */
  function instrument(a: ServiceAgent): void {
    if (instrumented.has(a)) return;
    instrumented.add(a);
    const { nc, holder } = a.running.coordination!;
    checker.watch(holder.agentId, a.region, holder.lease);
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
    await stack.stopAgent(a);
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
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 300, breakerResetMs: 200 },
    });
    for (const a of stack.agents) instrument(a);
    // Leases lapse and settle with time alone: look often, so the checker sees each change when it happens.
    poll = setInterval(() => {
      for (const a of stack.agents) leaseOf(a).poll();
    }, 20);
  }, 60_000);

  afterAll(async () => {
    clearInterval(poll);
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

  async function run(c: Case, tally: LapseTally): Promise<string[]> {
    const specs = new Map<string, PolicySpec>(c.policies.map((p) => [p.name, p]));
    for (const p of c.policies) await stack.putPolicy(p.name, policyBody(p));
    await leased(c.policies);
    const record = newRecord();
    const sharesBefore = checker.violations.length;
    // Any fault so far in the case: the breaker and leases take a moment to recover after a thaw or a restart.
    let faulted = false;
    const frozen = new Set<string>();

    /** The calls, all at once from each of their regions, each answer recorded. */
    const send = (calls: readonly Call[]): Promise<unknown> => {
      const failing = faulted;
      return Promise.all(
        calls.flatMap((call) =>
          call.regions.flatMap((region) =>
            Array.from({ length: call.repeat }, async () => {
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
          if (agent !== undefined) await stopAgent(agent);
          instrument(await stack.startAgent(step.region));
          if (frozen.size === 0) await leased(c.policies);
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
            if (step.lean !== undefined) {
              // Demand on one side until the rebalancer moved the lender's share (2 s of it confirm a move here).
              const policy = step.lean.checks[0]!.policy;
              const issued = () => ownValue(leaseOf(stack.agents[0]!).regionShares(policy, 'a'), lender) ?? 0;
              const start = issued();
              for (let i = 0; i < 25 && Math.abs(issued() - start) < 0.01; i++) {
                await send([step.lean]);
                await sleep(200);
              }
              if (Math.abs(issued() - start) >= 0.01) tally.leaned++;
            }
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
});
