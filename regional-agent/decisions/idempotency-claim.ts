import { createHash } from 'node:crypto';
import { idempotencyRecordKey, idempotencyTtlMs } from '../../core/keys.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { DecisionStore } from './decision-store.js';
import type { PreparedRequest } from './prepared.js';

export interface ClaimDeps {
  store: DecisionStore;
  guard: StoreGuard;
  metrics: AgentMetrics;
  idempotencyTtlMs: number;
}

/** Every policy, subject and cost of a request, hashed: what tells one request from another under one key. */
export function requestFingerprint(request: PreparedRequest): string {
  return createHash('sha1')
    .update(
      request.checks.map((p) => `${p.policy.name}/${p.policy.version} ${p.subject} ${p.cost}`).join('\n'),
    )
    .digest('hex');
}

/**
 * The key every group of a several-group request keeps its record under (in a store slot here, or at the home
 * region it is forwarded to): the caller's key bound to the whole request, so a record of another request that
 * used the key for the same checks (a one-group request, or another layered one) is never replayed for this one,
 * nor this one's for it, while a retry of this request, from any region, finds this one's records.
 */
export function boundKey(request: PreparedRequest, idempotencyKey: string): string {
  return `r.${createHash('sha1')
    .update(`${idempotencyKey}\n${requestFingerprint(request)}`)
    .digest('hex')}`;
}

/**
 * A request spanning several store groups claims its idempotency key once for the whole request, so the same
 * key on a different request is refused before anything is charged. One group needs no claim: the script's
 * own record catches the conflict. `none`: the claim could not be made (the store did not answer).
 */
export async function claimIdempotencyKey(
  deps: ClaimDeps,
  request: PreparedRequest,
  idempotencyKey: string,
): Promise<'new' | 'same' | 'conflict' | 'none'> {
  const [first] = request.checks;
  if (first === undefined) return 'none';
  const key = `${idempotencyRecordKey(first.subject, idempotencyKey)}:req`;
  const fingerprint = requestFingerprint(request);
  try {
    const outcome = await deps.guard.run('claim', () =>
      deps.store.claim(
        key,
        fingerprint,
        // As long as the longest record of any group may live: a claim that is new proves that no group's
        // record is this request's (layered-runner.ts).
        idempotencyTtlMs(deps.idempotencyTtlMs, []),
        request.dryRun,
      ),
    );
    if (outcome === 'conflict') deps.metrics.idempotency.labels('conflict').inc();
    return outcome;
  } catch {
    // Without the claim the per-slot records still replay retries; only cross-request conflicts go unseen.
    return 'none';
  }
}
