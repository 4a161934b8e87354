/**
 * What the store groups share: how one group's call went (GroupRun), how a store's answer settles it, one slot
 * group's guarded script call, and why a check with no room is refused.
 */
import type { Policy } from '../../core/policy/policy.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { CheckGroup, DayGroup, LogGroup } from './check-groups.js';
import type { FailureModes } from './failure-modes.js';
import type { Check } from './check.js';
import type { StoreCheck } from './prepared.js';

/**
 * Why a check with no room now is refused, from what its own bucket or counter holds (nothing was borrowed: a
 * counter never borrows, a token bucket with borrowing off or a strict or local policy does not):
 * `subject_exhausted` when its `limit` is the subject's whole budget (a strict or local policy, or a regional one
 * sized at a share of 1: `limit` reaches `whole`, the limit at share 1 in the same units), `share_exhausted` when
 * it is a part of it (the rest, in other regions, may be left).
 */
export function ownBudgetReason(
  policy: Pick<Policy, 'mode'>,
  limit: number,
  whole: number,
): 'subject_exhausted' | 'share_exhausted' {
  return policy.mode !== 'regional' || limit >= whole ? 'subject_exhausted' : 'share_exhausted';
}

/** How one group of checks went. */
export interface GroupRun {
  group: CheckGroup;
  allowed: boolean;
  /** True when the store charged these buckets now or earlier (replay): a later denial must refund them. */
  charged: boolean;
  replayed: boolean;
  /** True when this call charged (not a replay, not a dry run): what a conflict must give back. */
  fresh: boolean;
  /** True when the idempotency key answers another request: nothing was decided. */
  conflict: boolean;
  /** The group's idempotency record, deleted by a refund so a retry is decided afresh. */
  recordKey: string | undefined;
  /**
   * Checks whose new subject found its policy's creation cap used up and whose flood answer is `shared`: nothing
   * was decided; the runner decides them again on their policies' shared buckets.
   */
  reroute?: Check<StoreCheck>[] | undefined;
}

/** A run that has decided nothing yet. */
export function newRun(group: CheckGroup): GroupRun {
  return {
    group,
    allowed: true,
    charged: false,
    replayed: false,
    fresh: false,
    conflict: false,
    recordKey: undefined,
  };
}

/**
 * Record a store's answer in a run: a conflict (the idempotency key answers another request) marks it and
 * returns false, as nothing was decided; otherwise the run says whether it admitted, replayed and charged.
 */
export function settleRun(
  run: GroupRun,
  answer: { allowed: boolean; replayed: boolean; conflict: boolean },
  call: { dryRun: boolean; lookOnly: boolean; recordKey: string | undefined },
  metrics: AgentMetrics,
): boolean {
  if (answer.conflict) {
    metrics.idempotency.labels('conflict').inc();
    run.conflict = true;
    run.allowed = false;
    return false;
  }
  if (call.recordKey !== undefined && !call.lookOnly) {
    metrics.idempotency.labels(answer.replayed ? 'replayed' : 'new').inc();
  }
  run.allowed = answer.allowed;
  run.replayed = answer.replayed;
  run.fresh = !answer.replayed && !call.dryRun;
  run.charged = answer.allowed && !call.dryRun;
  run.recordKey = call.recordKey;
  return true;
}

/** A store's answer as settleRun reads it. */
type SettledAnswer = { allowed: boolean; replayed: boolean; conflict: boolean };

/**
 * One slot group's script call (sliding logs, daily budgets): behind the store guard, with the group's
 * idempotency record, settled into a new run. `reply` is undefined when nothing is left to write: the store did
 * not answer (every check took its policy's failure mode) or the key answers another request.
 */
export async function decideSlotGroup<R extends SettledAnswer>(
  deps: { guard: StoreGuard; failures: FailureModes; metrics: AgentMetrics; idempotencyTtlMs: number },
  call: {
    group: LogGroup | DayGroup;
    idempotencyKey: string | undefined;
    dryRun: boolean;
    lookOnly: boolean;
    recordTtlMs?: number | undefined;
  },
  recordKeyOf: (slotSubject: string, idempotencyKey: string) => string,
  decide: (dryRun: boolean, idempotency: { key: string; ttlMs: number } | undefined) => Promise<R>,
): Promise<{ run: GroupRun; reply: R | undefined }> {
  const { group, lookOnly } = call;
  const dryRun = call.dryRun || lookOnly;
  const run = newRun(group);
  const recordKey =
    call.idempotencyKey === undefined ? undefined : recordKeyOf(group.slotSubject, call.idempotencyKey);
  let reply: R;
  try {
    reply = await deps.guard.run('decide', () =>
      decide(
        dryRun,
        recordKey === undefined
          ? undefined
          : { key: recordKey, ttlMs: call.recordTtlMs ?? deps.idempotencyTtlMs },
      ),
    );
  } catch {
    run.allowed = deps.failures.failAll(group.checks, 'store_unavailable', dryRun);
    return { run, reply: undefined };
  }
  if (!settleRun(run, reply, { dryRun, lookOnly, recordKey }, deps.metrics)) return { run, reply: undefined };
  return { run, reply };
}
