import type { AgentMetrics } from '../observability/metrics.js';
import type { CheckGroup } from './check-groups.js';

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
  /** Per check of a log group: the entries its call wrote (stamp, first seq), what a refund takes back. */
  written?: { stamp: number; seq: number }[] | undefined;
  /**
   * Request positions of checks whose new subject found its policy's creation cap used up and whose flood answer
   * is `shared`: nothing was decided; the runner decides them again on their policies' shared buckets.
   */
  reroute?: number[] | undefined;
  /** Per check of a day group: the µs start of the day its call charged (0: nothing), what a refund names. */
  dayStarts?: number[] | undefined;
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
