/** The forwarded group: a request's strict checks homed in another region, decided there. */
import type { Clock } from '../../core/clock.js';
import { AgentErrors, shedError } from '../errors.js';
import type { ForwardGroup } from './check-groups.js';
import type { FailureModes } from './failure-modes.js';
import { HomeOverloadedError, type Forwarder } from './forwarder.js';
import { onTheWire } from '../resilience/wire-timeout.js';
import { newRun, type GroupRun } from './group-run.js';

export interface ForwardGroupDeps {
  forwarder?: Forwarder | undefined;
  failures: FailureModes;
  clock: Clock;
}

/**
 * Decide a request's strict checks at their home region, within what is left of the deadline, and write the
 * home's result into each check. No answer in time: the policies' failure modes decide (`home_unreachable`).
 * An idempotency conflict at the home is the caller's error and is thrown.
 */
export async function runForwardGroup(
  deps: ForwardGroupDeps,
  call: { group: ForwardGroup; idempotencyKey: string | undefined; dryRun: boolean; deadlineAt: number },
): Promise<GroupRun> {
  const { group, dryRun } = call;
  const run = newRun(group);
  try {
    // Earlier groups may have used the whole deadline: then nothing is sent (a request the caller gives up
    // on before it starts would only charge the home bucket for an answer nobody reads). The link to the home
    // gets its round trip on top of the deadline (docs/protocol.md, "Timings at a distance").
    // A deadline spent on this agent before the check could leave is this agent's overload, not the home's
    // absence: the request is shed (503, nothing charged), never answered home_unreachable.
    const localLeft = call.deadlineAt - deps.clock.now();
    if (localLeft <= 0) {
      throw shedError(
        'local_deadline',
        `the decision deadline passed on this agent before the check could be forwarded to ${group.homeRegion}`,
      );
    }
    const budgetMs = localLeft + (deps.forwarder?.linkAllowanceMs?.(group.homeRegion) ?? 0);
    if (deps.forwarder === undefined) throw new Error('no forwarder');
    const remote = await settleWithin(
      deps.forwarder.decide(
        group.homeRegion,
        {
          checks: group.checks.map(({ prepared: p }) =>
            p.subjectClass === undefined
              ? { policy: p.policy.name, subject: p.subject, cost: p.cost }
              : { policy: p.policy.name, subject: p.subject, cost: p.cost, class: p.subjectClass },
          ),
          idempotencyKey: call.idempotencyKey,
          dryRun,
        },
        budgetMs,
      ),
      budgetMs,
    );
    run.replayed = remote.replayed === true;
    group.checks.forEach((c, j) => {
      const r = remote.results[j];
      if (r === undefined) throw new Error(`home region answered no result for check ${j}`);
      c.result = r;
      c.fits = r.retryAfterMs === 0;
      if (!r.allowed) run.allowed = false;
    });
    return run;
  } catch (error) {
    if (error instanceof AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT) throw error;
    if (error instanceof AgentErrors.AGT_ERR_OVERLOADED) throw error;
    // A home that sheds says why (busy, or the request reached it too late): the whole request is shed, as the
    // agent's own admission control would, and the reason is the home's own words and its shed path.
    if (error instanceof HomeOverloadedError) throw shedError(error.shed, error.message);
    run.allowed = deps.failures.failAll(group.checks, 'home_unreachable', dryRun);
    return run;
  }
}

/**
 * The forwarder's answer, or a rejection once `ms` pass on the wire (a forwarder that keeps no time of its own
 * still answers within the deadline). A late rejection is always observed.
 */
function settleWithin<T>(promise: Promise<T>, ms: number): Promise<T> {
  if (ms <= 0) {
    promise.catch(() => undefined);
    return Promise.reject(new Error('deadline passed'));
  }
  return onTheWire(promise, ms, 'forwarded decision');
}
