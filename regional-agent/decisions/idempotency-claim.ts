import { createHash } from 'node:crypto';
import { dayRecordKey } from '../../core/models/daily-budget.js';
import { idempotencyRecordKey, idempotencyTtlMs } from '../../core/keys.js';
import { logRecordKey } from '../../core/models/sliding-log.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import type { CheckGroup } from './check-groups.js';
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
 * The key of the records of a request whose checks moved to their policies' shared buckets (subject-creation cap,
 * flood answer `shared`): those records live in the shared bucket's slot and fingerprint its key, which every new
 * subject shares, so under `idempotencyKey` alone one key sent by several new subjects replayed the first one's
 * admission to all the others, none of them charged. Bound to the subjects the request named (not its costs, so
 * the same key on another cost of the same subjects is still a conflict), each caller's key is its own again.
 */
export function subjectBoundKey(request: PreparedRequest, idempotencyKey: string): string {
  return `s.${createHash('sha1')
    .update(`${idempotencyKey}\n${request.checks.map((p) => p.subject).join('\n')}`)
    .digest('hex')}`;
}

/** What tells a whole-request claim's key from the records of the same subject and idempotency key. */
export const REQUEST_CLAIM_SUFFIX = ':req';

/**
 * What a several-group request writes on the record key of each of its groups' kinds and slots under the caller's
 * key: never a record (a record is "<fingerprint>|<fields>", lua/include/idempotency.lua), so a one-group request
 * that finds it there is a conflict, and this request's claim that finds a one-group request's record is one too.
 */
export function claimMark(fingerprint: string): string {
  return `claim:${fingerprint}`;
}

/**
 * The record keys a one-group request of the same kind and slot subject would use under the caller's key: where a
 * several-group request marks its claim. Forwarded checks have none here (their records are at their home).
 */
export function plainRecordKeys(groups: readonly CheckGroup[], idempotencyKey: string): string[] {
  const keys = new Set<string>();
  for (const g of groups) {
    if (g.kind === 'store') keys.add(idempotencyRecordKey(g.slotSubject, idempotencyKey));
    else if (g.kind === 'log') keys.add(logRecordKey(g.slotSubject, idempotencyKey));
    else if (g.kind === 'day') keys.add(dayRecordKey(g.slotSubject, idempotencyKey));
  }
  return [...keys];
}

/**
 * A request spanning several store groups claims its idempotency key once for the whole request, so the same
 * key on a different request is refused before anything is charged. Its groups keep their records under the key
 * bound to the whole request (`boundKey`), so the claim also marks the plain record key of each group
 * (`plainRecordKeys`, `claimMark`): a one-group request with the key finds the mark and is a conflict, and this
 * claim finds a one-group request's record and is one. Each mark is one `SET NX GET`, atomic against the script
 * that reads or writes the same key: whichever comes second is the conflict, so no interleaving decides both.
 * The marks go out with the whole-request claim, in the same round trip. One group needs no claim: the script's
 * own record catches the conflict. `none`: the claim could not be made (the store did not answer).
 */
export async function claimIdempotencyKey(
  deps: ClaimDeps,
  request: PreparedRequest,
  idempotencyKey: string,
  groups: readonly CheckGroup[],
): Promise<'new' | 'same' | 'conflict' | 'none'> {
  const [first] = request.checks;
  if (first === undefined) return 'none';
  const key = `${idempotencyRecordKey(first.subject, idempotencyKey)}${REQUEST_CLAIM_SUFFIX}`;
  const fingerprint = requestFingerprint(request);
  // As long as the longest record of any group may live: a claim that is new proves that no group's record is
  // this request's (layered-runner.ts).
  const ttlMs = idempotencyTtlMs(deps.idempotencyTtlMs, []);
  const claim = (k: string, value: string) =>
    deps.guard.run('claim', () => deps.store.claim(k, value, ttlMs, request.dryRun));
  try {
    const mark = claimMark(fingerprint);
    const [whole, ...marks] = await Promise.all([
      claim(key, fingerprint),
      ...plainRecordKeys(groups, idempotencyKey).map((k) => claim(k, mark)),
    ]);
    const outcome = whole === 'conflict' || marks.includes('conflict') ? 'conflict' : whole;
    if (outcome === 'conflict') deps.metrics.idempotency.labels('conflict').inc();
    return outcome;
  } catch {
    // Without the claim the per-slot records still replay retries; only cross-request conflicts go unseen.
    return 'none';
  }
}

/**
 * Where a several-group request notes that its first call was answered admitted while a failure mode (fail open,
 * emergency bucket) admitted one of its groups: that group kept no record, so every retry replays the others and
 * decides it afresh, which is otherwise what a retry racing its first call looks like (layered-runner.ts).
 */
function answeredKey(request: PreparedRequest, idempotencyKey: string): string | undefined {
  const [first] = request.checks;
  return first === undefined
    ? undefined
    : `${idempotencyRecordKey(first.subject, idempotencyKey)}:done${REQUEST_CLAIM_SUFFIX}`;
}

/** Note that this request's first call was answered admitted (best effort: without it, a retry is a 409). */
export async function markAnswered(
  deps: ClaimDeps,
  request: PreparedRequest,
  idempotencyKey: string,
  ttlMs: number,
): Promise<void> {
  const key = answeredKey(request, idempotencyKey);
  if (key === undefined || request.dryRun) return;
  try {
    await deps.guard.run('claim', () => deps.store.claim(key, requestFingerprint(request), ttlMs, false));
  } catch {
    // The note is what spares a retry a 409; the decision stands without it.
  }
}

/** True when this request's first call was answered admitted with a group a failure mode decided (markAnswered). */
export async function wasAnswered(
  deps: ClaimDeps,
  request: PreparedRequest,
  idempotencyKey: string,
): Promise<boolean> {
  const key = answeredKey(request, idempotencyKey);
  if (key === undefined) return false;
  try {
    const held = await deps.guard.run('claim', () =>
      deps.store.claim(key, requestFingerprint(request), 1, true),
    );
    return held === 'same';
  } catch {
    return false;
  }
}
