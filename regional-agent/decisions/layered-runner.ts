import { AgentErrors } from '../errors.js';
import { chargesOf } from './charges.js';
import { groupChecks, type CheckGroup } from './check-groups.js';
import type { FailureModes } from './failure-modes.js';
import { runForwardGroup, type ForwardGroupDeps } from './forward-group.js';
import type { GroupRun } from './group-run.js';
import { runDayGroup } from './day-group.js';
import { runLogGroup, type LogGroupDeps } from './log-group.js';
import { claimIdempotencyKey, type ClaimDeps } from './idempotency-claim.js';
import { summarize } from './outcome.js';
import { newSheet, type DecisionOutcome, type DecisionSheet, type PreparedRequest } from './prepared.js';
import { refundRuns, type RefundDeps } from './refunds.js';
import { runStoreGroup, type StoreGroupDeps } from './store-group.js';

export type LayeredRunnerDeps = StoreGroupDeps &
  ForwardGroupDeps &
  ClaimDeps &
  RefundDeps &
  LogGroupDeps & {
    failures: FailureModes;
  };

/**
 * Decides a prepared request all-or-nothing: checks with no way to be decided take their failure mode first;
 * then the groups run in order (store slots, then the home region), each charging only if every earlier one
 * admitted; after a denial the rest are only looked at, and what earlier groups were charged is refunded.
 * An idempotency conflict refunds what this call charged and throws.
 */
export class LayeredRunner {
  readonly #deps: LayeredRunnerDeps;

  constructor(deps: LayeredRunnerDeps) {
    this.#deps = deps;
  }

  /** Throws AGT_ERR_IDEMPOTENCY_CONFLICT, or AGT_ERR_OVERLOADED when the home region shed the request. */
  /** `chargeBy`: epoch ms after which nothing may be charged (a forwarded request's caller stops waiting). */
  async run(request: PreparedRequest, deadlineAt: number, chargeBy?: number): Promise<DecisionOutcome> {
    const { checks, dryRun, idempotencyKey } = request;
    const sheet = newSheet(checks.length);
    let denied = false;
    checks.forEach((p, i) => {
      if (p.route !== 'fail') return;
      const r = this.#deps.failures.fail(p, p.cause, dryRun);
      sheet.results[i] = r.result;
      sheet.fits[i] = r.fits;
      if (!r.fits) denied = true;
    });

    const groups = groupChecks(checks, (key) => this.#deps.store.slotOf(key));
    if (idempotencyKey !== undefined && groups.length > 1) {
      const claim = await claimIdempotencyKey(this.#deps, request, idempotencyKey);
      if (claim === 'conflict') throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
    }

    const runs: GroupRun[] = [];
    let next = 0;
    for (; next < groups.length && !denied; next++) {
      const group = groups[next];
      if (group === undefined) break;
      let run: GroupRun;
      try {
        run = await this.#runGroup(request, group, false, deadlineAt, sheet, chargeBy);
        if (run.conflict) throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
      } catch (error) {
        // A conflict, or a home region that shed the request: give back what this call charged, then say so.
        await refundRuns(
          this.#deps,
          runs.filter((r) => r.charged && r.fresh),
          sheet,
        );
        throw error;
      }
      runs.push(run);
      if (!run.allowed) denied = true;
    }
    // After a denial the rest is looked at, not charged: the caller still gets each check's numbers.
    if (next < groups.length) {
      await Promise.all(groups.slice(next).map((g) => this.#runGroup(request, g, true, deadlineAt, sheet)));
    }
    if (denied)
      await refundRuns(
        this.#deps,
        runs.filter((r) => r.charged),
        sheet,
      );
    const replayed = runs.length > 0 && runs.length === groups.length && runs.every((r) => r.replayed);
    const outcome = summarize(checks, sheet, !denied, replayed);
    if (!denied && !dryRun) outcome.charges = chargesOf(runs, checks.length);
    return outcome;
  }

  #runGroup(
    request: PreparedRequest,
    group: CheckGroup,
    lookOnly: boolean,
    deadlineAt: number,
    sheet: DecisionSheet,
    chargeBy?: number,
  ): Promise<GroupRun> {
    const { idempotencyKey } = request;
    const dryRun = request.dryRun || lookOnly;
    if (group.kind === 'forward') {
      return runForwardGroup(this.#deps, { group, idempotencyKey, dryRun, deadlineAt }, sheet);
    }
    if (group.kind === 'day') {
      return runDayGroup(this.#deps, { group, idempotencyKey, dryRun: request.dryRun, lookOnly }, sheet);
    }
    if (group.kind === 'log') {
      return runLogGroup(this.#deps, { group, idempotencyKey, dryRun: request.dryRun, lookOnly }, sheet);
    }
    return runStoreGroup(
      this.#deps,
      { group, idempotencyKey, dryRun: request.dryRun, lookOnly, deadlineAt, chargeBy },
      sheet,
    );
  }
}
