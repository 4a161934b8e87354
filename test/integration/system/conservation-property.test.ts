/**
 * The conservation property suite, integration tier (issue 25; docs/design.md "Conservation property suite"): a
 * sampled set of the generated cases (test/helpers/conservation-cases.ts) on the real stack: three regions, one
 * agent and one Redis each, the coordinator and real NATS, borrowing on. Shares move as the coordinator's
 * rebalancer moves them (the generated moves are its to make here); restarts stop an agent and start a new one;
 * freezes SIGSTOP a region's Redis. NATS cuts (one NATS server serves every region here) and reservations are
 * left to the unit tier. Clock jumps become short real waits. The global checker takes the widest window the real times allow.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DecisionResponse } from '../../../core/wire/agent.js';
import {
  answerLost,
  arbitraryCase,
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
import { eventually, startStack, type ServiceStack } from '../../helpers/fixture/index.js';

const SAMPLE = Number(process.env['QP_PROPERTY_STACK_RUNS'] ?? 10);
const SEED = Number(process.env['QP_PROPERTY_SEED'] ?? 25);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The case with its policies renamed for run `n` (each run has policies of its own on the shared stack). */
function renamed(c: Case, n: number): Case {
  const name = (p: string) => `c${n}-${p}`;
  return {
    policies: c.policies.map((p) => ({ ...p, name: name(p.name) })),
    borrowing: true,
    steps: c.steps.map((s) =>
      s.op === 'traffic'
        ? {
            ...s,
            calls: s.calls.map((call) => ({
              ...call,
              checks: call.checks.map((k) => ({ ...k, policy: name(k.policy) })),
            })),
          }
        : s.op === 'move'
          ? { ...s, policy: name(s.policy) }
          : s,
    ),
  };
}

describe('conservation on the real stack (sampled cases)', () => {
  let stack: ServiceStack;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 300, breakerResetMs: 200 },
    });
  }, 60_000);

  afterAll(async () => {
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

  async function run(c: Case): Promise<string[]> {
    const specs = new Map<string, PolicySpec>(c.policies.map((p) => [p.name, p]));
    for (const p of c.policies) await stack.putPolicy(p.name, policyBody(p));
    await leased(c.policies);
    const record = newRecord();
    // Any fault so far in the case: the breaker and leases take a moment to recover after a thaw or a restart.
    let faulted = false;
    const frozen = new Set<string>();
    try {
      for (const step of c.steps) {
        if (step.op === 'traffic') {
          for (let round = 0; round < step.rounds; round++) {
            if (round > 0) await sleep(Math.min(step.gapMs, 300));
            const failing = faulted;
            await Promise.all(
              step.calls.flatMap((call) =>
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
          const [agent] = stack.inRegion(step.region);
          if (agent !== undefined) await stack.stopAgent(agent);
          await stack.startAgent(step.region);
          if (frozen.size === 0) await leased(c.policies);
        }
        // 'move': the rebalancer moves shares on the real stack; 'cut' and 'reserve': left to the unit tier.
      }
    } finally {
      for (const r of frozen) await stack.region(r).redis.resume();
    }
    return [
      ...record.problems,
      ...unadmittedReplays(record),
      ...conservationViolations(c.policies, record.charges),
    ];
  }

  it(`holds every kind's bound on ${SAMPLE} sampled cases (seed ${SEED})`, async () => {
    const cases = fc.sample(arbitraryCase(8), { numRuns: SAMPLE, seed: SEED });
    expect(REGIONS).toEqual(stack.regions);
    for (const [n, c] of cases.entries()) {
      const found = await run(renamed(c, n));
      expect(found, JSON.stringify(renamed(c, n))).toEqual([]);
    }
  }, 120_000);
});
