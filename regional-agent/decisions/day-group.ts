/** The daily-budget store group: one slot's `kind: daily` checks decided in one `lua/daily_budget.lua` call. */
import type { CheckResult } from '../../core/wire/agent.js';
import { DAY_MICRO, dayLimitMicros, dayRecordKey } from '../../core/models/daily-budget.js';
import type { DayGroup } from './check-groups.js';
import { ownBudgetReason, decideSlotGroup, type GroupRun } from './group-run.js';
import type { LogGroupDeps } from './log-group.js';

/** One day group of one request, as the layered runner hands it over. */
export interface DayGroupCall {
  group: DayGroup;
  idempotencyKey: string | undefined;
  dryRun: boolean;
  /** Only look (an earlier group denied): report what the counters hold, write nothing. */
  lookOnly: boolean;
  /** The record TTL shared by every group of a several-group request (LogGroupCall). */
  recordTtlMs?: number | undefined;
}

/**
 * Decide one slot's daily budgets in one script call, all-or-nothing, and write each check's result, whether it
 * fit and what it charged (units: micro-units on the wire of the script, units in the result). No answer from
 * the store (or a clock more than a day off): the policies' failure modes decide (closed or open).
 */
export async function runDayGroup(deps: LogGroupDeps, call: DayGroupCall): Promise<GroupRun> {
  const { group, lookOnly } = call;
  const { run, reply } = await decideSlotGroup(deps, call, dayRecordKey, (dryRun, idempotency) =>
    deps.store.decideDay({
      checks: group.checks.map((c) => c.prepared.day),
      dryRun,
      ...(idempotency === undefined ? {} : { idempotency }),
    }),
  );
  if (reply === undefined) return run;
  group.checks.forEach((c, j) => {
    const p = c.prepared;
    const r = reply.results[j];
    if (r === undefined) throw new TypeError(`the store answered no result for daily check ${j}`);
    const limit = p.day.limit / DAY_MICRO;
    const left = r.remaining / DAY_MICRO;
    const result: CheckResult = {
      policy: p.policy.name,
      allowed: reply.allowed,
      remaining: lookOnly && reply.allowed ? Math.min(left + p.cost, limit) : left,
      limit,
      resetMs: r.resetMs,
      retryAfterMs: r.retryAfterMs < 0 ? null : r.retryAfterMs,
      mode: p.policy.mode,
    };
    if (r.retryAfterMs < 0) result.reason = 'cost_exceeds_share';
    else if (!reply.allowed && r.retryAfterMs > 0)
      result.reason = ownBudgetReason(p.policy, p.day.limit, dayLimitMicros(p.policy.capacity, 1));
    c.result = result;
    c.fits = r.retryAfterMs === 0;
    // The day its call charged (0: nothing), what a refund or a reservation names.
    if (run.charged && r.start > 0)
      c.charge = { kind: 'day', policy: p.policy.name, key: p.day.key, start: r.start, cost: p.cost };
  });
  return run;
}
