/**
 * `POST /v1/terms` without HTTP (docs/agent.md, "Terms"): a client trusted with this region's Redis asks for a
 * short term of one token-bucket policy, then decides its single checks itself with the agent's own script on the
 * agent's own bucket keys until the term runs out. The wire is core/wire/term.ts.
 *
 * - A term is a decision that lasts: it is entered in the share view (`ShareView.enter`) when it is given and
 *   left only once it has run out (TermHolds), so a shrink of the share it was sized with is acknowledged only
 *   after no client can still decide with it.
 * - It never outlives the share in force: `validForMs` is at most the time the default unit's share is sure not
 *   to shrink by the passage of time alone (`ShareView.stableForMs`: the lease's end, while it is valid).
 * - Its end is also carried in Redis time (`deadlineMicros`, converted so that it can only come early): the
 *   script refuses a call that runs later, so a late call changes nothing.
 * - It is answered only once its end (and the margin) is recorded in the region's Redis for this instance
 *   (terms-until.ts): a successor under the same name waits for it before the coordinator forgets this process.
 * - It is sized exactly as a decision of a subject with no override (check-router.ts `#route`); the subjects the
 *   agent sizes differently (an override share, a class named by subject) are listed in `exclude`.
 */
import { ownBudgetReason } from '../decisions/group-run.js';
import { createHash } from 'node:crypto';
import { kindOf } from '../../core/kinds/index.js';
import type { Policy } from '../../core/policy/policy.js';
import { ownValue } from '../../core/own-keys.js';
import { windowSecondsOf, withClass } from '../../core/policy/policy.js';
import type { RegionalShare, ShareView } from '../../core/shares/shares.js';
import { normalizeSubject } from '../../core/subjects/subject.js';
import { DEFAULT_RATE_LIMIT_DRAFT, type RateLimitDraft } from '../../core/wire/rate-limit-headers.js';
import {
  MAX_TERM_EXCLUDED,
  MAX_TERM_MS,
  MIN_TERM_MS,
  TermRequest,
  type TermBucket,
  type TermResponse,
  type TermUsage,
  termKeyFingerprint,
} from '../../core/wire/term.js';
import type { UsageSink } from '../decisions/decision-recorder.js';
import { AgentErrors, withProblems } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { PolicySource } from '../policies/policy-source.js';
import { agentMicros } from '../redis/redis-clock.js';
import { luaSource } from '../redis/scripts.js';
import { TERM_MARGIN_MS, type TermHolds } from './term-holds.js';
import type { TermsUntil } from './terms-until.js';

/** The script every direct check runs, and its SHA1 (EVALSHA), read once. */
const SCRIPT = luaSource('token_bucket');
export const TOKEN_BUCKET_SHA = createHash('sha1').update(SCRIPT).digest('hex');
/** The script a client hands back tokens it took ahead and did not spend with (lua/refund.lua), and its SHA1. */
const REFUND_SCRIPT = luaSource('refund');
export const REFUND_SHA = createHash('sha1').update(REFUND_SCRIPT).digest('hex');

/** A local policy's share: the whole budget, as the decision path sizes it (check-router.ts). */
const FULL_SHARE: RegionalShare = Object.freeze({ share: 1, epoch: 0 });

export interface TermIssuerOptions {
  policies: PolicySource;
  shares: ShareView;
  holds: TermHolds;
  metrics: AgentMetrics;
  /** Redis TIME of this process's instants; none: no terms (503). */
  redisClock: { toRedisMicrosNewest(micros: number): number } | undefined;
  /** Where each term's end is recorded before it is answered (terms-until.ts); none: no terms (503). */
  termsUntil: Pick<TermsUntil, 'cover'> | undefined;
  /** Where the usage clients report is counted, as the decision path counts its own (decision-recorder.ts). */
  usage: UsageSink | undefined;
  /** A shortfall handler (borrowing) is configured: a refused regional check may be covered by the agent. */
  borrows: boolean;
  terms: 'on' | 'off';
  termMs: number;
  hmacSecret: string | undefined;
  legacyHeaders: boolean;
  rateLimitDraft: RateLimitDraft | undefined;
  /** This process's clock, µs (agentMicros); tests replace it. */
  micros?: () => number;
}

/**
 * Why `policy` gives no terms (undefined: it may), as the refusal's detail: only a token bucket decided whole by
 * this region's store for a subject as the client sends it.
 */
export function termRefusal(policy: Policy): string | undefined {
  // Checked by name, not by a trait: the term hands out lua/token_bucket.lua, which decides this kind alone.
  if (policy.kind !== 'token_bucket')
    return `a ${policy.kind.replace('_', ' ')} policy is not decided by the token-bucket script`;
  if (policy.mode === 'strict') return 'a strict policy is decided by its home region, request by request';
  if (policy.shards !== undefined) return 'a sharded policy decides on a random sub-bucket per request';
  if (policy.newSubjects !== undefined)
    return 'a policy with a subject-creation cap decides new subjects at the store';
  if (policy.subjectKind === 'ip') return 'an ip policy buckets client addresses by prefix at the agent';
  return undefined;
}

function parse(body: unknown): TermRequest {
  const parsed = TermRequest.safeParse(body);
  if (parsed.success) return parsed.data;
  const list = parsed.error.issues.map((i) => `${i.path.map(String).join('.') || 'body'}: ${i.message}`);
  throw withProblems(new AgentErrors.AGT_ERR_INVALID_TERM(list.join('; ')), list);
}

/** Every usage subject as the decision path would name it; throws 400 AGT_ERR_INVALID_SUBJECT for any that is not. */
function usageSubjects(usage: readonly TermUsage[], hmacSecret: string | undefined): string[] {
  const bad: string[] = [];
  const subjects = usage.map(([raw], i) => {
    const s = normalizeSubject(raw, { hmacSecret });
    if (s.ok) return s.subject;
    bad.push(`usage.${i}: ${s.reason}`);
    return '';
  });
  if (bad.length > 0) throw withProblems(new AgentErrors.AGT_ERR_INVALID_SUBJECT(bad.join('; ')), bad);
  return subjects;
}

/**
 * The most tokens a client may hold taken ahead for one subject, as a part of the term's bucket: a take is at most
 * a tenth of it (GRANT_SHARE in packages/client/src/direct.ts). The client admits on them after the take, in a
 * later report than the one whose interval the take left the bucket in, so one report may count them on top of
 * what the bucket paid meanwhile.
 */
const HELD_AHEAD_SHARE = 10;

/**
 * Refuse (400 AGT_ERR_INVALID_TERM) a report of more tokens admitted for one subject than one term could admit: a
 * full bucket of the whole policy and its refill over the longest term, and the tokens a client may hold taken
 * ahead from an earlier term (a tenth of the bucket, rounded up). A client reports what it decided since its
 * previous request, which covers at most one term; more is not a report but an attempt to pull demand.
 */
function admittedWithinATerm(policy: Policy, usage: readonly TermUsage[]): void {
  const heldAhead = Math.ceil(policy.capacity / HELD_AHEAD_SHARE);
  const most = Math.ceil(policy.capacity + heldAhead + (policy.refillPerSecond * MAX_TERM_MS) / 1000);
  const bad: string[] = [];
  usage.forEach(([, admitted], i) => {
    if (admitted > most)
      bad.push(
        `usage.${i}: ${admitted} tokens admitted, more than one term of ${policy.name} admits (${most})`,
      );
  });
  if (bad.length > 0) throw withProblems(new AgentErrors.AGT_ERR_INVALID_TERM(bad.join('; ')), bad);
}

/**
 * Count what a client decided under its last term as the decision path counts its own decisions: tokens per
 * metric, and (regional policies only, as decision-recorder.ts) the usage the coordinator moves shares by.
 */
function recordUsage(
  options: TermIssuerOptions,
  policy: Policy,
  usage: readonly TermUsage[],
  subjects: readonly string[],
): void {
  const { metrics, usage: sink } = options;
  let admittedTokens = 0;
  let refusedTokens = 0;
  for (const [, admitted, refused] of usage) {
    admittedTokens += admitted;
    refusedTokens += refused;
  }
  if (admittedTokens > 0) metrics.directTokens.labels(policy.name, 'admitted').inc(admittedTokens);
  if (refusedTokens > 0) metrics.directTokens.labels(policy.name, 'refused').inc(refusedTokens);
  usage.forEach(([, admitted, refused], i) => {
    if (sink === undefined || policy.mode !== 'regional') return;
    const subject = subjects[i]!;
    // The subject's own rate, its class's when the policy names one for it (it is excluded from terms, but a
    // client may still report it), as the recorder passes `p.policy.refillPerSecond` of the classed policy.
    const rate = withClass(policy, ownValue(policy.subjects, subject)).refillPerSecond;
    // What the bucket kept is unknown here (the client does not report it). A refusal left it short: 0, as the
    // recorder says for a check that did not fit. Admitted tokens of a subject that was also refused ran its
    // bucket dry during the term: 0 too (it was near capacity); of one never refused, 1: no sign it was near
    // capacity, so it is not reported as constrained on admissions alone.
    if (admitted > 0) sink.record(policy.name, subject, admitted, true, refused > 0 ? 0 : 1, rate);
    if (refused > 0) sink.record(policy.name, subject, refused, false, 0, rate);
  });
}

/**
 * Give a term of the policy `input` names (and count the usage it reports). Throws 400 AGT_ERR_INVALID_TERM,
 * 404 AGT_ERR_UNKNOWN_POLICY, 400 AGT_ERR_INVALID_SUBJECT, 400 AGT_ERR_TERM_NOT_ALLOWED, 503
 * AGT_ERR_TERM_UNAVAILABLE, or 404 AGT_ERR_TERMS_OFF; nothing is counted or held unless the request is valid and
 * the policy gives terms. Resolves once the term's end is recorded in Redis (503 when that fails, the term's hold
 * left at once: no client has it).
 */
export async function issueTerm(options: TermIssuerOptions, input: unknown): Promise<TermResponse> {
  if (options.terms === 'off') throw new AgentErrors.AGT_ERR_TERMS_OFF();
  const body = parse(input);
  const { policies, shares, metrics, hmacSecret } = options;
  // A Map: `__proto__` and `constructor` are names like any other, unknown unless a policy has them.
  const policy = policies.current().get(body.policy);
  if (policy === undefined) throw new AgentErrors.AGT_ERR_UNKNOWN_POLICY(body.policy);
  const usage = body.usage ?? [];
  admittedWithinATerm(policy, usage);
  const subjects = usageSubjects(usage, hmacSecret);
  const name = policy.name;
  const exclude = [
    ...new Set([...(shares.overrideSubjects?.(name) ?? []), ...Object.keys(policy.subjects ?? {})]),
  ];
  const refusal =
    termRefusal(policy) ??
    (exclude.length > MAX_TERM_EXCLUDED
      ? `${exclude.length} subjects are decided apart (overrides and named subjects), more than a term lists (${MAX_TERM_EXCLUDED})`
      : undefined);
  if (refusal !== undefined) {
    metrics.terms.labels(name, 'not_allowed').inc();
    throw new AgentErrors.AGT_ERR_TERM_NOT_ALLOWED(name, refusal);
  }
  // The decisions of the last term happened whether or not a new one is given now: counted once, here.
  recordUsage(options, policy, usage, subjects);
  const unavailable = (why: string): never => {
    metrics.terms.labels(name, 'unavailable').inc();
    throw new AgentErrors.AGT_ERR_TERM_UNAVAILABLE(name, why);
  };
  if (options.holds.closing) return unavailable('the agent is shutting down');
  const regional = policy.mode === 'regional';
  if (regional && (shares.defaultShare === undefined || shares.stableForMs === undefined))
    return unavailable('this agent cannot bound how long its share holds');
  if (regional && shares.overrideSubjects === undefined)
    return unavailable('this agent cannot list the subjects it decides apart');
  // Read, entered and timed in one synchronous step: no record can be applied in between.
  const share = regional ? shares.defaultShare!(name) : FULL_SHARE;
  if (share === undefined) return unavailable('no_lease');
  const validForMs = Math.floor(Math.min(options.termMs, regional ? shares.stableForMs!(name) : Infinity));
  if (validForMs < MIN_TERM_MS)
    return unavailable(
      'the lease is not valid now (lapsed, settled, or ending sooner than the shortest term)',
    );
  const deadlineMicros =
    options.redisClock?.toRedisMicrosNewest((options.micros ?? agentMicros)() + validForMs * 1000) ?? 0;
  if (deadlineMicros <= 0) return unavailable('no Redis TIME sample yet');
  const termsUntil = options.termsUntil;
  if (termsUntil === undefined) return unavailable('this agent cannot record its terms in Redis');
  const bucket = termBucket(policy, share);
  // Held from now, before the record is written: a shrink acknowledged meanwhile could not see this term.
  const release = options.holds.hold(shares.enter(name), validForMs + TERM_MARGIN_MS);
  try {
    await termsUntil.cover(deadlineMicros + TERM_MARGIN_MS * 1000);
  } catch {
    // Never answered: no client decides with it, so it is held no longer.
    release();
    return unavailable('its end could not be recorded in Redis');
  }
  metrics.terms.labels(name, 'issued').inc();
  return {
    policy: name,
    version: policy.version,
    epoch: share.epoch,
    bucket,
    limit: bucket.capacity > 0 ? Math.floor(bucket.capacity) : 0,
    window: windowSecondsOf(policy),
    mode: policy.mode === 'local' ? 'local' : 'regional',
    validForMs,
    deadlineMicros,
    maxCost: policy.maxCost,
    // What a refusal for want of tokens says at the agent (store-group.ts `unborrowedReason`); with borrowing the
    // client sends refusals here instead.
    refusedReason: ownBudgetReason(policy, bucket.capacity, policy.capacity),
    refusals: options.borrows && regional ? 'agent' : 'final',
    ...(options.borrows && regional
      ? { budget: { capacity: policy.capacity, refillPerSecond: policy.refillPerSecond } }
      : {}),
    exclude,
    ...(hmacSecret === undefined ? {} : { hashed: { fingerprint: termKeyFingerprint(hmacSecret) } }),
    headers: { draft: options.rateLimitDraft ?? DEFAULT_RATE_LIMIT_DRAFT, legacy: options.legacyHeaders },
    scriptSha: TOKEN_BUCKET_SHA,
    ...(body.script === true ? { script: SCRIPT } : {}),
    refundSha: REFUND_SHA,
    ...(body.script === true ? { refundScript: REFUND_SCRIPT } : {}),
  };
}

/**
 * The bucket of a subject with no override under `share`: the kind's own sizing, as check-router.ts `#route`
 * sizes a check (the key and cost are the client's, per check).
 */
function termBucket(policy: Policy, share: RegionalShare): TermBucket {
  const kind = kindOf(policy.kind);
  if (kind.decidedBy !== 'store') throw new TypeError(`${policy.kind} is not decided by the store`);
  const { capacity, refillPerSecond, ttlMs, floor } = kind.sizing(policy, '', 1, share);
  return floor === undefined
    ? { capacity, refillPerSecond, ttlMs }
    : { capacity, refillPerSecond, ttlMs, floor };
}
