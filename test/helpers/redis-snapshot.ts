/**
 * Every key of a Redis and its value (DUMP), in key order, as one string: two snapshots are equal only when no
 * key was added, removed or changed anywhere (fuzz tests read it back after every refusal).
 */
import type { Redis } from 'ioredis';

export async function redisSnapshot(redis: Redis): Promise<string> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  keys.sort();
  const values = await Promise.all(keys.map((k) => redis.dumpBuffer(k)));
  return JSON.stringify(keys.map((k, i) => [k, values[i]?.toString('base64') ?? null]));
}
