/**
 * Strict mode on the wire: an agent outside a strict policy's home region forwards the check to the agents of
 * the home region (NATS request/reply to their queue group), which decide on their Redis and answer with the
 * results. Shared by the forwarder and the responder; every message is schema-checked on arrival.
 */
import { z } from 'zod';
import { CheckResult } from './agent.js';
import { TokenCost } from './bucket.js';
import { ClassName, PolicyName, RegionName } from '../policy/policy.js';
import { KvNamespace } from './kv.js';

/** Subject the home region's agents answer on, and their queue group (one of them answers each request). */
export function strictSubject(namespace: string, home: string): { subject: string; queue: string } {
  const ns = KvNamespace.parse(namespace);
  return { subject: `${ns}.v1.strict.${home}`, queue: `${ns}-strict-${home}` };
}

export const ForwardedCheck = z.strictObject({
  policy: PolicyName,
  /** Already normalized (or hashed) by the forwarding agent. */
  subject: z.string().min(1).max(128),
  cost: TokenCost,
  /** The subject's class, as the caller or the policy's `subjects` named it at the forwarding agent. */
  class: ClassName.optional(),
});
export type ForwardedCheck = z.infer<typeof ForwardedCheck>;

/** A decision forwarded to the home region. */
export const ForwardedDecision = z.strictObject({
  fromRegion: RegionName,
  checks: z.array(ForwardedCheck).min(1).max(16),
  /** The caller's idempotency key: the home records and replays the decision as it would for a local call. */
  idempotencyKey: z.string().min(1).max(256).optional(),
  dryRun: z.boolean(),
  /** What is left of the caller's deadline when the request leaves, ms: the home gives up past it. */
  budgetMs: z.number().int().positive().max(60_000),
  /**
   * When the caller stops waiting, in epoch ms of its clock (regions keep their clocks within NTP): a home that
   * takes the request up too close to it answers `overloaded` without deciding, so it charges nothing the caller
   * will not hear of.
   */
  deadlineAtMs: z.number().int().positive().optional(),
});
export type ForwardedDecision = z.infer<typeof ForwardedDecision>;

/** Error codes a home region may answer with instead of results. */
export const ForwardErrorCode = z.enum([
  'invalid_request',
  'not_home',
  'unknown_policy',
  'idempotency_conflict',
  'deadline',
  'failed',
  /** The home region shed the request before deciding anything (admission control): busy, not unreachable. */
  'overloaded',
]);
export type ForwardErrorCode = z.infer<typeof ForwardErrorCode>;

/**
 * Why a home answered `overloaded`, in the words its message carries (so a requester of any version tells them
 * apart without a new field on the wire): it took the request up after the caller's deadline (`late`), its
 * admission control refused it (`admission`), or its store call could not run before the caller's deadline
 * (`store_deadline`). A home may add to a message, never change these words.
 */
export const HOME_SHED_WORDS = {
  late: 'the home region took the request up too late to answer within its deadline',
  admission: 'the home region is overloaded',
  store_deadline: "the caller's deadline passed before the store could decide",
} as const;
export type HomeShed = keyof typeof HOME_SHED_WORDS;

/** Which of HOME_SHED_WORDS an `overloaded` answer's message carries; undefined: none (another version's words). */
export function homeShedOf(message: string): HomeShed | undefined {
  for (const [shed, words] of Object.entries(HOME_SHED_WORDS) as [HomeShed, string][]) {
    if (message.includes(words)) return shed;
  }
  return undefined;
}

export const ForwardedReply = z.union([
  z.strictObject({ results: z.array(CheckResult).min(1).max(16), replayed: z.boolean().optional() }),
  z.strictObject({ error: ForwardErrorCode, message: z.string().max(300) }),
]);
export type ForwardedReply = z.infer<typeof ForwardedReply>;

/** Most decisions one batch carries. */
export const MAX_FORWARD_BATCH = 256;

/**
 * Decisions for one home region forwarded together (one NATS request, on the same subject as a single one): the
 * checks an agent forwards to a home within one turn of its event loop. The home decides each on its own, as if
 * it had come alone, and answers them in order.
 */
export const ForwardedBatch = z.strictObject({
  fromRegion: RegionName,
  batch: z.array(ForwardedDecision).min(1).max(MAX_FORWARD_BATCH),
});
export type ForwardedBatch = z.infer<typeof ForwardedBatch>;

/** The home's answers to a batch, one per decision, in order. */
export const ForwardedBatchReply = z.union([
  z.strictObject({ replies: z.array(ForwardedReply).min(1).max(MAX_FORWARD_BATCH) }),
  z.strictObject({ error: ForwardErrorCode, message: z.string().max(300) }),
]);
export type ForwardedBatchReply = z.infer<typeof ForwardedBatchReply>;
