/**
 * The contract between TypeScript and `lua/token_bucket.lua`: requests in tokens and milliseconds, validated and
 * encoded into the script's KEYS/ARGV (micro-tokens, microseconds), and its integer reply decoded back.
 * Shared by the Redis store (regional-agent/redis) and the in-memory model (core/token-bucket.ts).
 */
import { z } from 'zod';
import { MAX_CAPACITY, MAX_REFILL_PER_SECOND } from './policy.js';
import { MICRO, type EncodedCheck, type EncodedReply, type EncodedRequest } from './token-bucket.js';

/** Most buckets one script call may decide. */
export const MAX_CHECKS_PER_CALL = 16;
/** Longest idempotency record TTL: one day. */
export const MAX_IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
/** Longest bucket TTL: 30 days. */
export const MAX_BUCKET_TTL_MS = 30 * 24 * 3600 * 1000;

const nonNegative = (max: number) => z.number().min(0).max(max);

/** One bucket to check, in tokens. */
export const BucketCheck = z.strictObject({
  /** Redis key of the bucket (see core/keys.ts). */
  key: z.string().min(1).max(512),
  /** Capacity in tokens in force for this bucket (the region's share of the policy's burst); 0 admits nothing. */
  capacity: nonNegative(MAX_CAPACITY),
  /** Refill in tokens per second in force for this bucket. */
  refillPerSecond: nonNegative(MAX_REFILL_PER_SECOND),
  /** Tokens this request costs; at least one micro-token. */
  cost: z
    .number()
    .min(1 / MICRO)
    .max(MAX_CAPACITY),
  /** Idle TTL of the key in ms; must cover a refill from empty. */
  ttlMs: z.number().int().min(1).max(MAX_BUCKET_TTL_MS),
  /**
   * Optional rate-history floor: buckets last written before `beforeMicros` (Redis time, µs) refill the elapsed
   * interval at most at `refillPerSecond` and keep at most `capacity` stored tokens.
   */
  floor: z
    .strictObject({
      beforeMicros: z.number().int().min(0),
      refillPerSecond: nonNegative(MAX_REFILL_PER_SECOND),
      capacity: nonNegative(MAX_CAPACITY),
    })
    .optional(),
});
export type BucketCheck = z.infer<typeof BucketCheck>;

/** One script call: buckets decided all-or-nothing, with an optional idempotency record and dry run. */
export const DecideRequest = z.strictObject({
  checks: z.array(BucketCheck).min(1).max(MAX_CHECKS_PER_CALL),
  /** Idempotency record: its key (same slot as the buckets) and TTL. A retry replays the first decision. */
  idempotency: z
    .strictObject({
      key: z.string().min(1).max(512),
      ttlMs: z.number().int().min(1).max(MAX_IDEMPOTENCY_TTL_MS),
    })
    .optional(),
  /** Decide without consuming or writing. */
  dryRun: z.boolean().optional(),
});
export type DecideRequest = z.infer<typeof DecideRequest>;

/** One bucket's decision, in tokens. */
export interface BucketDecision {
  /** True when the call admitted and this bucket was charged. */
  allowed: boolean;
  /** Tokens left after the decision (whole call denied: tokens before it). */
  remaining: number;
  /** Milliseconds until this bucket could take the cost; 0 if it can now; null when it never can. */
  retryAfterMs: number | null;
  /** Milliseconds until this bucket is full; null when it never will be. */
  resetMs: number | null;
}

/** The outcome of one call. A denial is an outcome, not an error. */
export interface Decision {
  allowed: boolean;
  /** True when an idempotency record answered with the first decision; nothing was charged. */
  replayed: boolean;
  /** Milliseconds until every bucket could take its cost: the largest of the buckets'; null when never. */
  retryAfterMs: number | null;
  results: BucketDecision[];
}

/** A request the script would refuse; thrown before any I/O. */
export class InvalidBucketRequestError extends Error {
  readonly code = 'QP_BADARG';
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super(`invalid bucket request: ${issues.join('; ')}`);
    this.name = 'InvalidBucketRequestError';
    this.issues = issues;
  }
}

/** Capacity and stored-token bounds round down (never mint); costs round up (never undercharge). */
const microDown = (tokens: number) => Math.floor(tokens * MICRO + 1e-6);
const microUp = (tokens: number) => Math.ceil(tokens * MICRO - 1e-6);

/** Validate a request and convert it to script units. Throws InvalidBucketRequestError listing every problem. */
export function encodeRequest(input: DecideRequest): EncodedRequest {
  const parsed = DecideRequest.safeParse(input);
  if (!parsed.success) {
    throw new InvalidBucketRequestError(
      parsed.error.issues.map((i) => `${i.path.join('.') || 'request'}: ${i.message}`),
    );
  }
  const request = parsed.data;
  return {
    keys: request.checks.map((c) => c.key),
    checks: request.checks.map((c): EncodedCheck => ({
      capacity: microDown(c.capacity),
      rate: c.refillPerSecond,
      cost: Math.max(1, microUp(c.cost)),
      ttlMs: c.ttlMs,
      floorBefore: c.floor?.beforeMicros ?? 0,
      floorRate: c.floor?.refillPerSecond ?? 0,
      floorCapacity: c.floor === undefined ? 0 : microDown(c.floor.capacity),
    })),
    dryRun: request.dryRun ?? false,
    idempotency: request.idempotency,
  };
}

/** KEYS and ARGV of a script call. */
export function scriptArguments(request: EncodedRequest): { keys: string[]; argv: string[] } {
  const keys = request.idempotency === undefined ? request.keys : [...request.keys, request.idempotency.key];
  const argv: string[] = [
    String(request.checks.length),
    request.dryRun ? '1' : '0',
    String(request.idempotency?.ttlMs ?? 0),
  ];
  for (const c of request.checks) {
    argv.push(
      String(c.capacity),
      String(c.rate),
      String(c.cost),
      String(c.ttlMs),
      String(c.floorBefore),
      String(c.floorRate),
      String(c.floorCapacity),
    );
  }
  return { keys, argv };
}

/** Parse the script's integer reply; throws when its shape is not the one documented in the script header. */
export function parseReply(reply: unknown, checks: number): EncodedReply {
  if (!Array.isArray(reply) || reply.length !== 2 + 4 * checks || !reply.every((v) => Number.isInteger(v))) {
    throw new TypeError(`unexpected token bucket reply: ${JSON.stringify(reply)}`);
  }
  const values = reply as number[];
  const results = [];
  for (let i = 0; i < checks; i++) {
    const b = 2 + 4 * i;
    results.push({
      allowed: values[b] === 1,
      remaining: values[b + 1]!,
      retryAfterMs: values[b + 2]!,
      resetMs: values[b + 3]!,
    });
  }
  return { allowed: values[0] === 1, replayed: values[1] === 1, results };
}

const orNull = (ms: number) => (ms < 0 ? null : ms);

/** Script units back to tokens. */
export function decodeReply(reply: EncodedReply): Decision {
  let retryAfterMs: number | null = 0;
  const results = reply.results.map((r): BucketDecision => {
    if (retryAfterMs !== null)
      retryAfterMs = r.retryAfterMs < 0 ? null : Math.max(retryAfterMs, r.retryAfterMs);
    return {
      allowed: r.allowed,
      remaining: r.remaining / MICRO,
      retryAfterMs: orNull(r.retryAfterMs),
      resetMs: orNull(r.resetMs),
    };
  });
  return {
    allowed: reply.allowed,
    replayed: reply.replayed,
    retryAfterMs: reply.allowed ? 0 : retryAfterMs,
    results,
  };
}
