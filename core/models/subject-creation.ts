/**
 * The subject-creation cap (`newSubjects` on a token-bucket policy): at most `perMinute` new subject buckets of
 * one policy in any rolling minute, per region. A patient attacker who stays under every rate while minting
 * identities would otherwise fill Redis with one-shot buckets; with the cap, keys are bounded by it.
 *
 * How a decision goes (the agent's store group, step for step as `SubjectCreationModel` below):
 * 1. The token-bucket script decides the subject's bucket with `mustExist`: a known subject (its bucket exists)
 *    is decided in that one call, as without a cap (no extra round trip).
 * 2. A missing bucket decides nothing and is answered `missing`. The agent then takes one creation for the
 *    subject from the policy's creation log (`lua/subject_creation.lua` on `creationKey`: an exact rolling minute,
 *    one entry per created subject, named by its bucket key, at most `perMinute` entries, so its memory is
 *    bounded by the cap too).
 * 3. A creation taken: the check is decided again without `mustExist`, which creates the bucket. None left: the
 *    flood answer, `deny` (refused, reason `subject_flood`, retry when the oldest creation leaves the minute) or
 *    `shared` (decided on the policy's one shared bucket, `sharedBucketKey`, sized like a subject's bucket,
 *    reason `shared_bucket`).
 *
 * Creations are taken before buckets exist, so buckets created per minute never exceed the creations taken: the
 * bound holds under races too. A creation is idempotent per subject: racing first decisions of one new subject
 * (in one agent, or in several agents on one Redis) find its entry in the window and cost nothing more, so a
 * new subject costs exactly one creation however many of its requests race (`CreationLogModel`).
 *
 * On a cluster the creation log lives in the policy's own slot, apart from every subject: the second script is
 * why step 2 is a separate call (and why the log names the subject by a member, never by reading its bucket).
 * Pure: no I/O here.
 */
import { z } from 'zod';
import type { EncodedCheck, EncodedReply } from './token-bucket.js';
import { BucketModel } from './token-bucket.js';
import { encodeRequest, validStoreRequest, type BucketCheck } from '../wire/bucket.js';
import { ExpiringMap } from './expiring-map.js';
import { bucketKey } from '../keys.js';
import { MAX_NEW_SUBJECTS_PER_MINUTE, type NewSubjects } from '../kinds/token-bucket/schema.js';
import { DeadlinePassedError, integerReply } from '../wire/script.js';

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

/** One creation asked of a policy's creation log (`lua/subject_creation.lua`): for the subject `member` names. */
export const CreationRequest = z
  .strictObject({
    /** The policy's creation log, `creationKey(policy)`. */
    key: z.string().min(1).max(512),
    /** The subject's bucket key: one creation per member within the window, however often it is asked. */
    member: z.string().min(1).max(512),
    /** Creations in any rolling window (the policy's `perMinute`). */
    limit: z.number().int().min(1).max(MAX_NEW_SUBJECTS_PER_MINUTE),
    windowMs: z.number().int().min(1).max(CREATION_WINDOW_MS),
    /** TTL of the log after a creation, ms; at least the window. */
    ttlMs: z
      .number()
      .int()
      .min(1)
      .max(10 * CREATION_WINDOW_MS),
    /** Only look: say what a real call would answer, write nothing. */
    dryRun: z.boolean().optional(),
  })
  .refine((r) => r.ttlMs >= r.windowMs, { path: ['ttlMs'], message: 'ttlMs must be ≥ windowMs' });
export type CreationRequest = z.infer<typeof CreationRequest>;

/**
 * What the creation log answered: `taken` (a creation counted now), `held` (this subject already holds one within
 * the window: nothing counted), `full` (the cap is used up).
 */
export type CreationOutcome = 'taken' | 'held' | 'full';

export interface CreationReply {
  outcome: CreationOutcome;
  /** Creations still free in the window (after this one, when taken). */
  remaining: number;
  /** `full`: ms until a creation leaves the window; 0 otherwise. */
  retryAfterMs: number;
}

/** The creation asked for the subject whose bucket is `member`, under `policy`'s cap (a dry run only looks). */
export function creationRequest(
  policy: string,
  cap: Pick<NewSubjects, 'perMinute'>,
  member: string,
  dryRun = false,
): CreationRequest {
  return {
    key: creationKey(policy),
    member,
    limit: cap.perMinute,
    windowMs: CREATION_WINDOW_MS,
    ttlMs: CREATION_WINDOW_MS,
    ...(dryRun ? { dryRun } : {}),
  };
}

/** Validate a creation request; throws an InvalidBucketRequestError listing every problem. */
export function parseCreationRequest(input: CreationRequest): CreationRequest {
  return validStoreRequest(CreationRequest, input);
}

/** KEYS and ARGV of `lua/subject_creation.lua` (deadline: µs of Redis time, 0 = none). */
export function creationArguments(
  request: CreationRequest,
  deadline = 0,
): { keys: string[]; argv: string[] } {
  return {
    keys: [request.key],
    argv: [
      String(request.limit),
      String(request.windowMs * 1000),
      String(request.ttlMs),
      request.dryRun === true ? '1' : '0',
      String(deadline),
      request.member,
    ],
  };
}

const OUTCOMES: Record<number, CreationOutcome> = { 0: 'full', 1: 'taken', 2: 'held' };

/** Parse the script's reply; throws DeadlinePassedError for a late call, TypeError for any other shape. */
export function parseCreationReply(reply: unknown): CreationReply {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -1) throw new DeadlinePassedError();
  const [code, remaining, retryAfterMs] = integerReply(reply, 3, 'subject-creation reply');
  const outcome = OUTCOMES[code!];
  if (outcome === undefined) throw new TypeError(`unexpected subject-creation outcome: ${String(code)}`);
  return { outcome, remaining: remaining!, retryAfterMs: retryAfterMs! };
}

const msUp = (us: number): number => Math.ceil(us / 1000);

/**
 * Creation logs in memory, step for step as `lua/subject_creation.lua` (TTLs included): the model the script must
 * agree with (test/cases/subject-creation-cases.ts), and the creation log of unit tests and the simulator-side
 * bench. A log maps members (subjects' bucket keys) to the µs they were created at.
 */
export class CreationLogModel {
  readonly #logs = new ExpiringMap<{ entries: Map<string, number>; expiresAt: number }>();

  /** Take (or look at, dry) one creation at `now` (µs). */
  take(request: CreationRequest, now: number): CreationReply {
    const log = this.#logs.live(request.key, now);
    const scores = [...(log?.entries.values() ?? [])].sort((a, b) => a - b);
    const newest = scores[scores.length - 1];
    const t = newest === undefined ? now : Math.max(now, newest);
    const window = request.windowMs * 1000;
    const inWindow = scores.filter((s) => s > t - window);
    const count = inWindow.length;
    const mine = log?.entries.get(request.member);
    if (mine !== undefined && mine > t - window) {
      return { outcome: 'held', remaining: Math.max(0, request.limit - count), retryAfterMs: 0 };
    }
    const fits = count + 1 <= request.limit;
    const retryAfterMs = fits ? 0 : msUp(inWindow[count - request.limit]! + window - t);
    if (request.dryRun !== true && log !== undefined) {
      for (const [m, s] of log.entries) if (s <= t - window) log.entries.delete(m);
      if (log.entries.size === 0) this.#logs.delete(request.key, now);
    }
    if (request.dryRun !== true && fits) {
      const entries = this.#logs.live(request.key, now)?.entries ?? new Map<string, number>();
      entries.set(request.member, t);
      this.#logs.set(request.key, { entries, expiresAt: t + request.ttlMs * 1000 });
    }
    if (!fits) return { outcome: 'full', remaining: 0, retryAfterMs };
    return { outcome: 'taken', remaining: request.limit - count - 1, retryAfterMs: 0 };
  }

  /** Members of the log at `now` (an expired log holds none), oldest first, with their µs stamps. */
  entries(key: string, now: number): [string, number][] {
    const log = this.#logs.live(key, now);
    return [...(log?.entries ?? [])].sort((a, b) => a[1] - b[1] || (a[0] < b[0] ? -1 : 1));
  }
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
  creation: CreationReply | undefined;
}

/**
 * The reference model of a capped decision: buckets (BucketModel, the script's model) and creation logs
 * (CreationLogModel) in memory, asked in the order the agent asks Redis. `subjectBucket` is the subject's bucket
 * check as the agent sizes it; `sharedBucket` the shared one (same sizes, `sharedBucketKey`).
 */
export class SubjectCreationModel {
  readonly buckets = new BucketModel();
  readonly logs = new CreationLogModel();

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
    const creation = this.logs.take(creationRequest(policy.name, cap, subjectBucket.key, dryRun), now);
    if (creation.outcome !== 'full') {
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
