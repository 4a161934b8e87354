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
 * Redis key of an idempotency record, in the slot of `subject` (the first check's subject). The caller's key is
 * hashed so its length and characters never reach Redis.
 */
export function idempotencyRecordKey(subject: string, idempotencyKey: string): string {
  const digest = createHash('sha256').update(idempotencyKey, 'utf8').digest('base64url').slice(0, 22);
  return `rl:idem:{${subject}}:${digest}`;
}

/** The hash tag Redis Cluster uses to pick a key's slot (the text between the first `{` and the next `}`). */
export function hashTag(key: string): string {
  const open = key.indexOf('{');
  if (open === -1) return key;
  const close = key.indexOf('}', open + 1);
  if (close === -1 || close === open + 1) return key;
  return key.slice(open + 1, close);
}
