import { createHash } from 'node:crypto';

/**
 * Redis key of one bucket: `rl:v{version}:{subject}:{policy}`. The braces around the subject are a Redis
 * Cluster hash tag, so every bucket of one subject lives in one slot and layered checks run in one script.
 * A version bump moves decisions to new keys; the old ones die by TTL.
 */
export function bucketKey(version: number, subject: string, policy: string): string {
  return `rl:v${version}:{${subject}}:${policy}`;
}

/**
 * Redis key of sub-bucket `shard` of a sharded policy: the subject's tag with `#shard` appended, so the shards of
 * one hot subject hash to different cluster slots (`#` is not a subject character: no real subject collides).
 */
export function shardKey(version: number, subject: string, policy: string, shard: number): string {
  return bucketKey(version, `${subject}#${shard}`, policy);
}

/**
 * Redis key of a local grant's record (lua/grant.lua): in the slot of its bucket `bucket` (the same hash tag), named
 * by the grant's id (core/wire/grant.ts GrantId, 22 base64url characters, checked before it gets here).
 */
export function grantRecordKey(bucket: string, grantId: string): string {
  return `rl:grant:{${hashTag(bucket)}}:${grantId}`;
}

/**
 * Redis key of an idempotency record, in the slot of `subject` (the first check's subject). The caller's key is
 * hashed so its length and characters never reach Redis.
 */
export function idempotencyRecordKey(subject: string, idempotencyKey: string): string {
  const digest = createHash('sha256').update(idempotencyKey, 'utf8').digest('base64url').slice(0, 22);
  return `rl:idem:{${subject}}:${digest}`;
}

/** Most live idempotency records one subject keeps by default (`QP_IDEMPOTENCY_MAX_RECORDS`). */
export const DEFAULT_IDEMPOTENCY_RECORDS_PER_SUBJECT = 1000;
/** The most that setting may be. */
export const MAX_IDEMPOTENCY_RECORDS_PER_SUBJECT = 1_000_000;

/**
 * Redis key of the index of a subject's idempotency records (a sorted set of record keys by expiry), in the slot
 * of the record `recordKey`: the script keeps at most a set number of live records per subject with it.
 */
export function idempotencyIndexKey(recordKey: string): string {
  return `rl:idem-index:{${hashTag(recordKey)}}`;
}

/**
 * How long an idempotency record lives: the configured bound, and never longer than the shortest idle TTL of the
 * policies the request checks (a retry after its bucket expired has nothing to replay against: its bucket is new).
 */
export function idempotencyTtlMs(boundMs: number, idleTtlSeconds: readonly number[]): number {
  let ttl = boundMs;
  for (const s of idleTtlSeconds) ttl = Math.min(ttl, s * 1000);
  return ttl;
}

/** The hash tag Redis Cluster uses to pick a key's slot (the text between the first `{` and the next `}`). */
export function hashTag(key: string): string {
  const open = key.indexOf('{');
  if (open === -1) return key;
  const close = key.indexOf('}', open + 1);
  if (close === -1 || close === open + 1) return key;
  return key.slice(open + 1, close);
}

/**
 * Redis key of the latest instant until which a direct-decision term given by the agent instance `instance` (its
 * `QP_INSTANCE`, or `host:port`) may be in use (lua/terms_until.lua): one per instance, so the replicas of a region
 * sharing its Redis each keep their own.
 */
export function termsUntilKey(instance: string): string {
  return `rl:terms-until:{${instance}}`;
}
