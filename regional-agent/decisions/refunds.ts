/** Refunds after a later denial: what earlier store groups of a request charged is given back. */
import type { Logger } from 'pino';
import { DAY_MICRO } from '../../core/models/daily-budget.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { DecisionStore } from './decision-store.js';
import type { GroupRun } from './group-run.js';
import type { Check } from './check.js';

export interface RefundDeps {
  store: DecisionStore;
  guard: StoreGuard;
  metrics: AgentMetrics;
  log: Logger;
}

/**
 * Give back what earlier store groups were charged, so no grant survives a later denial; each check's result's
 * `remaining` becomes what its bucket holds after the refund. A refund that fails is counted and logged: that
 * grant stands.
 */
export async function refundRuns(deps: RefundDeps, runs: readonly GroupRun[]): Promise<void> {
  await Promise.all(
    runs.map(async (run) => {
      const { group } = run;
      if (group.kind === 'log') return refundLogRun(deps, run);
      if (group.kind === 'day') return refundDayRun(deps, run);
      if (group.kind !== 'store') return;
      try {
        const outcome = await deps.guard.run('refund', () =>
          deps.store.refund({
            checks: group.checks.map(({ prepared: p }) => ({
              key: p.bucket.key,
              cost: p.cost,
              capacity: p.bucket.capacity,
            })),
            idempotencyRecordKey: run.recordKey,
          }),
        );
        group.checks.forEach((c, j) => {
          const tokens = outcome.results[j]?.tokens ?? null;
          const result = c.result;
          if (tokens === null || result === undefined) return;
          result.remaining = tokens;
          // The reset the store gave was of the charged bucket: full again now, or when refilled from here.
          const { capacity, refillPerSecond } = c.prepared.bucket;
          result.resetMs =
            tokens >= capacity
              ? 0
              : refillPerSecond > 0
                ? Math.ceil(((capacity - tokens) / refillPerSecond) * 1000)
                : null;
        });
        deps.metrics.refunds.labels('ok').inc();
      } catch (error) {
        refundFailed(deps, group.checks, error);
      }
    }),
  );
}

function refundFailed(deps: RefundDeps, checks: readonly Check[], error: unknown): void {
  deps.metrics.refunds.labels('failed').inc();
  deps.log.warn(
    { err: error, policies: checks.map((c) => c.prepared.policy.name) },
    'refund failed: an earlier grant stands',
  );
}

/**
 * Take back the entries a charged log group wrote (a later group denied), deleting its idempotency record; each
 * check's `remaining` grows by what came back. A refund that fails is counted and logged: that grant stands.
 */
async function refundLogRun(deps: RefundDeps, run: GroupRun): Promise<void> {
  const { group } = run;
  if (group.kind !== 'log') return;
  try {
    const outcome = await deps.guard.run('refund', () =>
      deps.store.refundLog({
        keys: group.checks.map((c) => c.prepared.log.key),
        // A check whose call wrote no entry has no charge: stamp 0 names none.
        entries: group.checks.map(({ charge, prepared: p }) =>
          charge?.kind === 'log'
            ? { stamp: charge.stamp, seq: charge.seq, cost: p.cost }
            : { stamp: 0, seq: 0, cost: p.cost },
        ),
        recordKey: run.recordKey,
      }),
    );
    group.checks.forEach((c, j) => {
      const result = c.result;
      const back = outcome.removed[j] ?? 0;
      if (result === undefined) return;
      result.remaining = Math.min(result.remaining + back, result.limit);
      // A log holding nothing in its window once its entries are back is whole now (its reset was the charged log's).
      if (back > 0 && result.remaining >= result.limit) result.resetMs = 0;
      // A concurrency slot given back is no lease to hold.
      delete result.lease;
    });
    deps.metrics.refunds.labels('ok').inc();
  } catch (error) {
    refundFailed(deps, group.checks, error);
  }
}

/**
 * Give back what a charged day group took (a later group denied), deleting its idempotency record; each check's
 * `remaining` grows by what came back. A refund that fails is counted and logged: that grant stands.
 */
async function refundDayRun(deps: RefundDeps, run: GroupRun): Promise<void> {
  const { group } = run;
  if (group.kind !== 'day') return;
  try {
    const outcome = await deps.guard.run('refund', () =>
      deps.store.refundDay({
        keys: group.checks.map((c) => c.prepared.day.key),
        // A check whose call charged no day has no charge: start 0 names none.
        entries: group.checks.map(({ charge, prepared: p }) => ({
          start: charge?.kind === 'day' ? charge.start : 0,
          cost: p.day.cost,
        })),
        recordKey: run.recordKey,
      }),
    );
    group.checks.forEach((c, j) => {
      const result = c.result;
      const back = (outcome.refunded[j] ?? 0) / DAY_MICRO;
      if (result !== undefined) result.remaining = Math.min(result.remaining + back, result.limit);
    });
    deps.metrics.refunds.labels('ok').inc();
  } catch (error) {
    refundFailed(deps, group.checks, error);
  }
}
