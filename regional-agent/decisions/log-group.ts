/** The sliding-log store group: one slot's sliding-log and concurrency checks decided in one `lua/sliding_log.lua` call. */
import type { CheckResult } from '../../core/wire/agent.js';
import { leaseToken, type LeaseKey } from '../../core/concurrency.js';
import { kindOf } from '../../core/kinds/index.js';
import { logRecordKey } from '../../core/models/sliding-log.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { LogGroup } from './check-groups.js';
import type { DecisionStore } from './decision-store.js';
import type { FailureModes } from './failure-modes.js';
import { ownBudgetReason, decideSlotGroup, type GroupRun } from './group-run.js';

export interface LogGroupDeps {
  store: DecisionStore;
  guard: StoreGuard;
  failures: FailureModes;
  metrics: AgentMetrics;
  idempotencyTtlMs: number;
  /** This agent's region: a concurrency lease names it, so it is released where it is held. */
  region: string;
  /** Signs lease tokens, so a release names only entries this region's agents wrote. */
  leaseKey: LeaseKey;
}

/** One log group of one request, as the layered runner hands it over. */
export interface LogGroupCall {
  group: LogGroup;
  idempotencyKey: string | undefined;
  dryRun: boolean;
  /** Only look (an earlier group denied): report what the logs hold, write nothing. */
  lookOnly: boolean;
  /**
   * How long this group's idempotency record lives, ms, when the request has several groups: one figure for all
   * of them (layered-runner.ts), so a late retry never finds some of its records gone and others alive.
   */
  recordTtlMs?: number | undefined;
}

/**
 * Decide one slot's sliding logs in one script call, all-or-nothing, and write each check's result, whether it
 * fit and what it charged. No answer from the store: the policies' failure modes decide (closed or open; sliding
 * logs have no emergency bucket).
 */
export async function runLogGroup(deps: LogGroupDeps, call: LogGroupCall): Promise<GroupRun> {
  const { group, lookOnly } = call;
  const { run, reply } = await decideSlotGroup(deps, call, logRecordKey, (dryRun, idempotency) =>
    deps.store.decideLog({
      checks: group.checks.map((c) => c.prepared.log),
      dryRun,
      ...(idempotency === undefined ? {} : { idempotency }),
    }),
  );
  if (reply === undefined) return run;
  group.checks.forEach((c, j) => {
    const p = c.prepared;
    const r = reply.results[j];
    if (r === undefined) throw new TypeError(`the store answered no result for log check ${j}`);
    const remaining = lookOnly && reply.allowed ? Math.min(r.remaining + p.cost, p.log.limit) : r.remaining;
    const result: CheckResult = {
      policy: p.policy.name,
      allowed: reply.allowed,
      remaining,
      limit: p.log.limit,
      resetMs: r.resetMs,
      retryAfterMs: r.retryAfterMs < 0 ? null : r.retryAfterMs,
      mode: p.policy.mode,
    };
    if (r.retryAfterMs < 0) result.reason = 'cost_exceeds_share';
    else if (!reply.allowed && r.retryAfterMs > 0)
      result.reason = ownBudgetReason(p.policy, p.log.limit, p.policy.capacity);
    // An acquired concurrency slot: the token that releases exactly the entries this call wrote.
    if (kindOf(p.policy.kind).leases && reply.allowed && r.stamp > 0) {
      result.lease = leaseToken(
        {
          region: deps.region,
          policy: p.policy.name,
          version: p.policy.version,
          subject: p.subject,
          stamp: r.stamp,
          seq: r.seq,
          cost: p.cost,
        },
        deps.leaseKey,
      );
    }
    c.result = result;
    c.fits = r.retryAfterMs === 0;
    // The entries its call wrote (stamp 0: none), what a refund or a reservation takes back.
    if (run.charged && r.stamp > 0) {
      c.charge = {
        kind: 'log',
        policy: p.policy.name,
        key: p.log.key,
        stamp: r.stamp,
        seq: r.seq,
        cost: p.cost,
      };
    }
  });
  return run;
}
