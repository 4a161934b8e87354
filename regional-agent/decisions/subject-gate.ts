/**
 * The second step of a capped decision (core/models/subject-creation.ts): the store said some checks' buckets are
 * missing; take one creation per such subject from its policy's creation log, and say which ones got none.
 */
import type { CheckResult } from '../../core/wire/agent.js';
import { creationRequest, type CreationReply } from '../../core/models/subject-creation.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { DecisionStore } from './decision-store.js';
import type { Check } from './check.js';
import type { StoreCheck } from './prepared.js';

/** A check whose policy's cap is used up: when a creation frees (ms), and what the policy answers. */
export interface Flooded {
  /** Position of the check in its group. */
  index: number;
  retryAfterMs: number;
  answer: 'deny' | 'shared';
}

/**
 * Single flight of creations in one agent, per subject bucket (its key names the policy, the subject and the
 * version): while a creation for a bucket is asked, every other decision of the same new subject waits for that
 * answer instead of asking its own, then decides on the bucket it made. Across agents on one Redis the script
 * itself counts a subject once (`lua/subject_creation.lua`); this saves the other callers' round trips. An entry
 * lives while its call is in flight, so the map holds at most the decisions in flight.
 */
export class CreationFlights {
  readonly #flights = new Map<string, Promise<CreationReply>>();

  /** The answer to the creation of `bucket`: the one in flight, else `take()`'s. */
  once(
    bucket: string,
    take: () => Promise<CreationReply>,
  ): { reply: Promise<CreationReply>; leader: boolean } {
    const running = this.#flights.get(bucket);
    if (running !== undefined) return { reply: running, leader: false };
    const reply = take().finally(() => this.#flights.delete(bucket));
    this.#flights.set(bucket, reply);
    return { reply, leader: true };
  }
}

/**
 * Take a creation for each missing check (one creation-log call each, in the policy's slot; a dry run only
 * looks, taking nothing, and asks on its own). Decisions of one subject racing in this agent share one call
 * (`deps.creations`). Returns the checks that got none. Throws when the store fails: the caller's failure modes answer,
 * as for any store failure.
 */
export async function takeCreations(
  deps: { store: DecisionStore; guard: StoreGuard; metrics: AgentMetrics; creations: CreationFlights },
  checks: readonly Check<StoreCheck>[],
  missing: readonly number[],
  dryRun: boolean,
): Promise<Flooded[]> {
  const flooded: Flooded[] = [];
  for (const index of missing) {
    const { policy, bucket } = checks[index]!.prepared;
    const cap = policy.newSubjects;
    if (cap === undefined) throw new TypeError(`check ${index} of ${policy.name} is missing but has no cap`);
    const take = () =>
      deps.guard.run('decide', () =>
        deps.store.takeCreation(creationRequest(policy.name, cap, bucket.key, dryRun)),
      );
    const flight = dryRun ? { reply: take(), leader: true } : deps.creations.once(bucket.key, take);
    const creation = await flight.reply;
    if (creation.outcome !== 'full') {
      // Counted once per subject: by the decision that took it, not by those that joined or found it held.
      if (!dryRun && flight.leader && creation.outcome === 'taken')
        deps.metrics.subjectsCreated.labels(policy.name).inc();
      continue;
    }
    flooded.push({ index, retryAfterMs: Math.max(0, creation.retryAfterMs), answer: cap.flood });
    if (!dryRun) deps.metrics.subjectFlood.labels(policy.name, cap.flood).inc();
  }
  return flooded;
}

/** The result of a check refused by its policy's flood answer `deny`: no bucket was made or charged. */
export function floodResult(check: StoreCheck, flooded: Flooded): CheckResult {
  return {
    policy: check.policy.name,
    allowed: false,
    remaining: 0,
    limit: check.bucket.capacity,
    // A new subject's bucket would start full: it is "full" as soon as a creation frees.
    resetMs: flooded.retryAfterMs,
    retryAfterMs: flooded.retryAfterMs,
    mode: check.policy.mode,
    reason: 'subject_flood',
  };
}
