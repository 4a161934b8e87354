/**
 * The contract between TypeScript and `lua/token_bucket.lua`: requests in tokens and milliseconds, validated and
 * encoded into the script's KEYS/ARGV (micro-tokens, microseconds), and its integer reply decoded back.
 * Shared by the Redis store (regional-agent/redis) and the in-memory model (core/models/token-bucket.ts).
 */
import { z } from 'zod';
import {
  DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT,
  idempotencyIndexKey,
  MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT,
} from '../keys.js';
import { MAX_CAPACITY, MAX_REFILL_PER_SECOND } from '../policy/limits.js';
import { DeadlinePassedError } from './script.js';
import {
  MICRO,
  type EncodedCheck,
  type EncodedReply,
  type EncodedRequest,
  type EncodedResult,
} from '../models/token-bucket.js';

/** Most buckets one script call may decide. */
export const MAX_CHECKS_PER_CALL = 16;
/** Longest idempotency record TTL: one day. */
export const MAX_IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
/** Longest bucket TTL: 30 days. */
export const MAX_BUCKET_TTL_MS = 30 * 24 * 3600 * 1000;

const nonNegative = (max: number) => z.number().min(0).max(max);

/** Smallest cost a check may have: one micro-token, the bucket's resolution. */
export const MIN_COST = 1 / MICRO;
/** Largest cost a check may have. */
export const MAX_COST = MAX_CAPACITY;

/**
 * Tokens one check costs, the one rule for every layer: the agent's HTTP body and forward-auth query, forwarded
 * strict checks, and the bucket store. A cost the bucket cannot represent is the caller's error at the edge,
 * never a store failure.
 */
export const TokenCost = z
  .number()
  .min(MIN_COST, `cost must be at least ${MIN_COST} (one micro-token)`)
  .max(MAX_COST, `cost must be at most ${MAX_COST}`);

const COST_MIN = TokenCost.minValue!;
const COST_MAX = TokenCost.maxValue!;

/**
 * True exactly for what TokenCost accepts (the hot path's check, without zod): its bounds are read from the
 * schema, so the two cannot drift, and a property test (test/unit/core/wire/bucket-wire.test.ts) holds them to the same set.
 */
export function isTokenCost(v: unknown): v is number {
  return typeof v === 'number' && v >= COST_MIN && v <= COST_MAX;
}

/** One bucket to check, in tokens. */
export const BucketCheck = z.strictObject({
  /** Redis key of the bucket (see core/keys.ts). */
  key: z.string().min(1).max(512),
  /** Capacity in tokens in force for this bucket (the region's share of the policy's burst); 0 admits nothing. */
  capacity: nonNegative(MAX_CAPACITY),
  /** Refill in tokens per second in force for this bucket. */
  refillPerSecond: nonNegative(MAX_REFILL_PER_SECOND),
  /** Tokens this request costs; at least one micro-token. */
  cost: TokenCost,
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
  /**
   * The bucket must already exist: when it is missing, the call decides nothing for the request and says so
   * (`Decision.missing`). A policy with a subject-creation cap sets it, so only a creation makes a bucket.
   */
  mustExist: z.boolean().optional(),
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
      /** Most live records the subject keeps; the store's setting when absent. */
      maxRecords: z.number().int().min(1).max(MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT).optional(),
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
  /**
   * True when the idempotency key already answers a different request (other buckets or costs): nothing was
   * decided or charged. Callers report it as an error, not as a denial.
   */
  conflict: boolean;
  /** Milliseconds until every bucket could take its cost: the largest of the buckets'; null when never. */
  retryAfterMs: number | null;
  /**
   * Indexes of `mustExist` checks whose bucket was missing: nothing was decided or charged, every result is
   * zero. Absent when no such bucket was missing.
   */
  missing?: number[] | undefined;
  results: BucketDecision[];
}

/**
 * A request a store script would refuse (any store: buckets, refunds, sliding logs); thrown before any I/O. The
 * one error that says the request, not the store, was wrong: it never counts as a store failure.
 */
export class InvalidBucketRequestError extends Error {
  readonly code = 'QP_BADARG';
  readonly issues: readonly string[];
  constructor(issues: readonly string[]) {
    super(`invalid bucket request: ${issues.join('; ')}`);
    this.name = 'InvalidBucketRequestError';
    this.issues = issues;
  }
}

/**
 * A request's checks with each bucket once: checks of one key (two new subjects of one policy moved to its shared
 * bucket) become one check of their summed cost, decided once, all-or-nothing with the rest, instead of two
 * reads of the same tokens of which only the last write counts. `of[i]` is the merged check of check `i`;
 * undefined when no key repeats (the request as it is). A sum above MAX_COST is left as it is: no bucket holds it,
 * and no store takes it (the caller answers such checks as never fitting).
 */
export function mergeRepeatedBuckets(
  checks: readonly BucketCheck[],
): { checks: BucketCheck[]; of: number[] } | undefined {
  if (checks.length < 2) return undefined;
  let at: Map<string, number> | undefined;
  for (let i = 1; i < checks.length && at === undefined; i++) {
    for (let j = 0; j < i; j++) if (checks[j]!.key === checks[i]!.key) at = new Map();
  }
  if (at === undefined) return undefined;
  const merged: BucketCheck[] = [];
  const of = checks.map((c) => {
    const m = at.get(c.key);
    if (m === undefined) {
      at.set(c.key, merged.length);
      merged.push(c);
      return merged.length - 1;
    }
    merged[m] = { ...merged[m]!, cost: merged[m]!.cost + c.cost };
    return m;
  });
  return { checks: merged, of };
}

/** The decision of merged checks (mergeRepeatedBuckets) as one result per original check. */
export function spreadDecision(decision: Decision, of: readonly number[]): Decision {
  const spread: Decision = { ...decision, results: of.map((m) => ({ ...decision.results[m]! })) };
  const { missing } = decision;
  if (missing !== undefined) spread.missing = of.flatMap((m, i) => (missing.includes(m) ? [i] : []));
  return spread;
}

/** `input` as `schema` parses it, or an InvalidBucketRequestError listing every problem. */
export function validStoreRequest<T>(schema: z.ZodType<T>, input: unknown): T {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  throw new InvalidBucketRequestError(
    parsed.error.issues.map((i) => `${i.path.join('.') || 'request'}: ${i.message}`),
  );
}

/** Capacity and stored-token bounds round down (never mint); costs round up (never undercharge). */
export const microDown = (tokens: number): number => Math.floor(tokens * MICRO + 1e-6);
const microUp = (tokens: number) => Math.ceil(tokens * MICRO - 1e-6);

const within = (v: unknown, lo: number, hi: number): boolean => typeof v === 'number' && v >= lo && v <= hi;
const wholeWithin = (v: unknown, lo: number, hi: number): boolean =>
  Number.isSafeInteger(v) && within(v, lo, hi);
const text = (v: unknown): boolean => typeof v === 'string' && v.length >= 1 && v.length <= 512;
const onlyKeys = (o: object, allowed: ReadonlySet<string>): boolean =>
  Object.keys(o).every((k) => allowed.has(k));

const CHECK_KEYS = new Set(['key', 'capacity', 'refillPerSecond', 'cost', 'ttlMs', 'floor', 'mustExist']);
const FLOOR_KEYS = new Set(['beforeMicros', 'refillPerSecond', 'capacity']);
const REQUEST_KEYS = new Set(['checks', 'idempotency', 'dryRun']);
const IDEMPOTENCY_KEYS = new Set(['key', 'ttlMs', 'maxRecords']);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function looksValidCheck(c: unknown): boolean {
  if (!isObject(c) || !onlyKeys(c, CHECK_KEYS)) return false;
  const floor = c['floor'];
  const mustExist = c['mustExist'];
  return (
    (mustExist === undefined || typeof mustExist === 'boolean') &&
    text(c['key']) &&
    within(c['capacity'], 0, MAX_CAPACITY) &&
    within(c['refillPerSecond'], 0, MAX_REFILL_PER_SECOND) &&
    isTokenCost(c['cost']) &&
    wholeWithin(c['ttlMs'], 1, MAX_BUCKET_TTL_MS) &&
    (floor === undefined ||
      (isObject(floor) &&
        onlyKeys(floor, FLOOR_KEYS) &&
        wholeWithin(floor['beforeMicros'], 0, Number.MAX_SAFE_INTEGER) &&
        within(floor['refillPerSecond'], 0, MAX_REFILL_PER_SECOND) &&
        within(floor['capacity'], 0, MAX_CAPACITY)))
  );
}

/**
 * The hot path's check: true only for requests DecideRequest accepts (a property test holds it to that), so
 * valid requests skip zod; anything else goes to zod for its exact list of problems.
 */
export function looksValid(input: unknown): input is DecideRequest {
  if (!isObject(input) || !onlyKeys(input, REQUEST_KEYS)) return false;
  const { checks, idempotency, dryRun } = input;
  if (!Array.isArray(checks) || checks.length < 1 || checks.length > MAX_CHECKS_PER_CALL) return false;
  for (const c of checks) if (!looksValidCheck(c)) return false;
  if (dryRun !== undefined && typeof dryRun !== 'boolean') return false;
  return (
    idempotency === undefined ||
    (isObject(idempotency) &&
      onlyKeys(idempotency, IDEMPOTENCY_KEYS) &&
      text(idempotency['key']) &&
      wholeWithin(idempotency['ttlMs'], 1, MAX_IDEMPOTENCY_TTL_MS) &&
      (idempotency['maxRecords'] === undefined ||
        wholeWithin(idempotency['maxRecords'], 1, MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT)))
  );
}

/** Validate a request and convert it to script units. Throws InvalidBucketRequestError listing every problem. */
export function encodeRequest(input: DecideRequest): EncodedRequest {
  let request: DecideRequest = input;
  if (!looksValid(input)) request = validStoreRequest(DecideRequest, input);
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
      ...(c.mustExist === true ? { mustExist: true } : {}),
    })),
    dryRun: request.dryRun ?? false,
    idempotency: request.idempotency,
  };
}

/** Most requests one script call may carry (the script refuses more). */
export const MAX_REQUESTS_PER_CALL = 256;

/**
 * KEYS and ARGV of one script call deciding `requests` in order. `deadlineMicros` (Redis time, µs; 0 for none)
 * is when the call stops being worth running: the script then changes nothing.
 */
export function scriptCall(
  requests: readonly EncodedRequest[],
  deadlineMicros = 0,
): { keys: string[]; argv: string[] } {
  if (!(Number.isSafeInteger(deadlineMicros) && deadlineMicros >= 0)) {
    throw new RangeError(`deadline must be a whole number of microseconds >= 0, got ${deadlineMicros}`);
  }
  const keys: string[] = [];
  const argv: string[] = [String(requests.length), String(deadlineMicros)];
  for (const request of requests) {
    for (const key of request.keys) keys.push(key);
    const idem = request.idempotency;
    if (idem !== undefined) keys.push(idem.key, idempotencyIndexKey(idem.key));
    // Floors are rare: they travel (flag 2) only when some bucket of the request has one.
    const floors = request.checks.some((c) => c.floorBefore > 0);
    // Buckets that must exist travel (flag 4) as one bitmask: bit i for bucket i + 1.
    let guard = 0;
    request.checks.forEach((c, i) => {
      if (c.mustExist === true) guard += 2 ** i;
    });
    const flags = (request.dryRun ? 1 : 0) | (floors ? 2 : 0) | (guard > 0 ? 4 : 0);
    argv.push(String(request.checks.length), String(flags), String(idem?.ttlMs ?? 0));
    if (idem !== undefined) {
      argv.push(String(idem.maxRecords ?? DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT));
    }
    if (guard > 0) argv.push(String(guard));
    for (const c of request.checks) {
      argv.push(String(c.capacity), String(c.rate), String(c.cost), String(c.ttlMs));
      if (floors) argv.push(String(c.floorBefore), String(c.floorRate), String(c.floorCapacity));
    }
  }
  return { keys, argv };
}

/** KEYS and ARGV of a call deciding one request. */
export function scriptArguments(request: EncodedRequest): { keys: string[]; argv: string[] } {
  return scriptCall([request]);
}

/**
 * Parse the script's flat integer reply into one reply per request, given each request's number of buckets;
 * throws DeadlinePassedError for a call that ran too late, TypeError when the shape is not the one the script
 * header documents.
 */
export function parseReplies(reply: unknown, checkCounts: readonly number[]): EncodedReply[] {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -1) throw new DeadlinePassedError();
  let expected = 0;
  for (const n of checkCounts) expected += 2 + 4 * n;
  if (!Array.isArray(reply) || reply.length !== expected) {
    throw new TypeError(`unexpected token bucket reply: ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  const values = reply as unknown[];
  for (const v of values)
    if (!Number.isInteger(v)) throw new TypeError(`non-integer in token bucket reply: ${String(v)}`);
  const out: EncodedReply[] = [];
  let at = 0;
  for (const n of checkCounts) {
    const results = new Array<EncodedResult>(n);
    for (let i = 0; i < n; i++) {
      const b = at + 2 + 4 * i;
      results[i] = {
        allowed: values[b] === 1,
        remaining: values[b + 1] as number,
        retryAfterMs: values[b + 2] as number,
        resetMs: values[b + 3] as number,
      };
    }
    const one: EncodedReply = {
      allowed: values[at] === 1,
      replayed: values[at + 1] === 1,
      conflict: values[at + 1] === 2,
      results,
    };
    // Code 3: buckets that must exist were missing; each one's first value is 1.
    if (values[at + 1] === 3) {
      one.missing = [];
      results.forEach((r, i) => {
        if (r.allowed) one.missing!.push(i);
        r.allowed = false;
      });
    }
    out.push(one);
    at += 2 + 4 * n;
  }
  return out;
}

/** Parse the reply of a one-request call with `checks` buckets. */
export function parseReply(reply: unknown, checks: number): EncodedReply {
  return parseReplies(reply, [checks])[0]!;
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
  const decision: Decision = {
    allowed: reply.allowed,
    replayed: reply.replayed,
    conflict: reply.conflict,
    retryAfterMs: reply.allowed ? 0 : retryAfterMs,
    results,
  };
  if (reply.missing !== undefined) decision.missing = reply.missing;
  return decision;
}
