/**
 * Every key of a Redis and its value (DUMP), in key order, as one string: two snapshots are equal only when no
 * key was added, removed or changed anywhere (fuzz tests read it back after every refusal).
 */
import type { Redis } from 'ioredis';

export async function redisSnapshot(redis: Redis, patterns: readonly string[] = ['*']): Promise<string> {
  // With `patterns` (SCAN MATCH globs), only the keys that match one of them: a Redis other test files share
  // (the containers backend) changes under keys that are not this test's.
  const found = new Set<string>();
  for (const pattern of patterns) {
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      for (const key of batch) found.add(key);
      cursor = next;
    } while (cursor !== '0');
  }
  const keys = [...found].sort();
  const values = await Promise.all(keys.map((k) => redis.dumpBuffer(k)));
  return JSON.stringify(keys.map((k, i) => [k, values[i]?.toString('base64') ?? null]));
}
