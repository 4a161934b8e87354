import type { CheckResult } from '../../core/agent-wire.js';
import { DAY_MICRO, dayLimitMicros, dayRecordKey } from '../../core/daily-budget.js';
import type { DayGroup } from './check-groups.js';
import { ownBudgetReason, decideSlotGroup, type GroupRun } from './group-run.js';
import type { LogGroupDeps } from './log-group.js';
import type { DecisionSheet } from './prepared.js';

/** One day group of one request, as the layered runner hands it over. */
export interface DayGroupCall {
  group: DayGroup;
  idempotencyKey: string | undefined;
  dryRun: boolean;
  /** Only look (an earlier group denied): report what the counters hold, write nothing. */
  lookOnly: boolean;
}

/**
 * Decide one slot's daily budgets in one script call, all-or-nothing, and write each check's result into the
 * sheet (units: micro-units on the wire of the script, units in the result). No answer from the store (or a
 * clock more than a day off): the policies' failure modes decide (closed or open).
 */
export async function runDayGroup(
  deps: LogGroupDeps,
  call: DayGroupCall,
  sheet: DecisionSheet,
): Promise<GroupRun> {
  const { group, lookOnly } = call;
  const { run, reply } = await decideSlotGroup(
    deps,
    call,
    dayRecordKey,
    (dryRun, idempotency) =>
      deps.store.decideDay({
        checks: group.checks.map((p) => p.day),
        dryRun,
        ...(idempotency === undefined ? {} : { idempotency }),
      }),
    sheet,
  );
  if (reply === undefined) return run;
  run.dayStarts = reply.results.map((r) => r.start);
  group.checks.forEach((p, j) => {
    const at = group.indexes[j] ?? j;
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
    sheet.results[at] = result;
    sheet.fits[at] = r.retryAfterMs === 0;
  });
  return run;
}
