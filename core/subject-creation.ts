/**
 * The subject-creation cap (`newSubjects` on a token-bucket policy): at most `perMinute` new subject buckets of
 * one policy in any rolling minute, per region. A patient attacker who stays under every rate while minting
 * identities would otherwise fill Redis with one-shot buckets; with the cap, keys are bounded by it.
 *
 * How a decision goes (the agent's store group, step for step as `SubjectCreationModel` below):
 * 1. The token-bucket script decides the subject's bucket with `mustExist`: a known subject (its bucket exists)
 *    is decided in that one call, as without a cap (no extra round trip).
 * 2. A missing bucket decides nothing and is answered `missing`. The agent then takes one creation from the
 *    policy's creation log (`lua/sliding_log.lua` on `creationKey`: an exact rolling minute, at most `perMinute`
 *    entries, so its memory is bounded by the cap too).
 * 3. A creation taken: the check is decided again without `mustExist`, which creates the bucket. None left: the
 *    flood answer, `deny` (refused, reason `subject_flood`, retry when the oldest creation leaves the minute) or
 *    `shared` (decided on the policy's one shared bucket, `sharedBucketKey`, sized like a subject's bucket,
 *    reason `shared_bucket`).
 *
 * Creations are taken before buckets exist, so buckets created per minute never exceed the creations taken: the
 * bound holds under races too. Racing first decisions of one new subject may each take a creation (and the
 * bucket is created once): the cap can be spent faster than subjects appear, never exceeded.
 *
 * On a cluster the creation log lives in the policy's own slot, apart from every subject: the second script is
 * why step 2 is a separate call. Pure: no I/O here.
 */
import type { EncodedCheck, EncodedReply } from './token-bucket.js';
import { BucketModel } from './token-bucket.js';
import { encodeRequest, type BucketCheck } from './bucket-wire.js';
import { bucketKey } from './keys.js';
import type { NewSubjects } from './policy.js';
import { SlidingLogModel, type LogCheck, type LogReply } from './sliding-log.js';

/**
 * The subject whose bucket is a policy's shared bucket. `#` is no subject character (plain subjects and hashed
 * ones never contain it), so no caller's subject can name it.
 */
export const ANONYMOUS_SUBJECT = '#anonymous';

/** The window the cap counts creations in: one rolling minute. */
export const CREATION_WINDOW_MS = 60_000;

/**
 * Redis key of a policy's creation log in this region's Redis: its own hash tag, so on a cluster it sits in one
 * slot of its own. Not versioned: a version bump (every subject new again) still counts against the same cap.
 */
export function creationKey(policy: string): string {
  return `rl:new-subjects:{#${policy}}`;
}

/** Redis key of a policy's shared bucket (flood answer `shared`). */
export function sharedBucketKey(version: number, policy: string): string {
  return bucketKey(version, ANONYMOUS_SUBJECT, policy);
}

/** The creation-log check that takes one creation of `policy` (a dry run only looks). */
export function creationCheck(policy: string, cap: Pick<NewSubjects, 'perMinute'>): LogCheck {
  return {
    key: creationKey(policy),
    limit: cap.perMinute,
    windowMs: CREATION_WINDOW_MS,
    cost: 1,
    ttlMs: CREATION_WINDOW_MS,
  };
}

/** How a capped check went: its bucket existed, a creation was taken for it, or the cap was used up. */
export type CreationStep = 'known' | 'created' | 'flood';

/** What the model decided for one check. */
export interface CappedDecision {
  step: CreationStep;
  /** The bucket decided: the subject's, or the shared one (`flood` with `shared`); undefined for a denial. */
  key: string | undefined;
  /** The token-bucket reply of that bucket; undefined when the flood answer denied. */
  reply: EncodedReply | undefined;
  /** The creation log's answer, when one was asked (a missing bucket). */
  creation: LogReply | undefined;
}

/**
 * The reference model of a capped decision: buckets (BucketModel, the script's model) and creation logs
 * (SlidingLogModel) in memory, asked in the order the agent asks Redis. `subjectBucket` is the subject's bucket
 * check as the agent sizes it; `sharedBucket` the shared one (same sizes, `sharedBucketKey`).
 */
export class SubjectCreationModel {
  readonly buckets = new BucketModel();
  readonly logs = new SlidingLogModel();

  /** Decide one check of `policy` at `now` (µs). */
  decide(
    policy: { name: string; newSubjects?: NewSubjects | undefined },
    subjectBucket: BucketCheck,
    sharedBucket: BucketCheck,
    now: number,
    dryRun = false,
  ): CappedDecision {
    const cap = policy.newSubjects;
    if (cap === undefined) throw new RangeError(`policy ${policy.name} has no subject-creation cap`);
    const guarded = encodeRequest({ checks: [{ ...subjectBucket, mustExist: true }], dryRun });
    const first = this.buckets.evaluate(guarded, now);
    if (first.missing === undefined) {
      return { step: 'known', key: subjectBucket.key, reply: first, creation: undefined };
    }
    const creation = this.logs.evaluate({ checks: [creationCheck(policy.name, cap)], dryRun }, now);
    if (creation.allowed) {
      const reply = this.buckets.evaluate(unguarded(guarded), now);
      return { step: 'created', key: subjectBucket.key, reply, creation };
    }
    if (cap.flood === 'deny') return { step: 'flood', key: undefined, reply: undefined, creation };
    const reply = this.buckets.evaluate(encodeRequest({ checks: [sharedBucket], dryRun }), now);
    return { step: 'flood', key: sharedBucket.key, reply, creation };
  }

  /** Live keys at `now`: subject and shared buckets (what the cap bounds). */
  bucketKeys(now: number): number {
    return this.buckets.size(now);
  }
}

function unguarded(request: ReturnType<typeof encodeRequest>): ReturnType<typeof encodeRequest> {
  return {
    ...request,
    checks: request.checks.map(({ mustExist: _, ...c }): EncodedCheck => c),
  };
}
