/**
 * The `redis-failover` fault on a real Redis, as the simulator models it: the region's Redis is replaced by a
 * replica that lost the last `failoverLagS` of writes (`snapshot`: the policy's keys as they were then, each with
 * the time to live it had left) or everything (`full`). The policy's bucket keys (`rl:v{version}:{…}:{policy}`)
 * are the only ones touched, so a stack shared with other policies keeps theirs.
 */
import { Redis } from 'ioredis';
import { bucketKey } from '../../core/keys.js';

/** The policy's keys at one instant: DUMP payloads and remaining time to live. */
export interface KeySnapshot {
  takenAt: number;
  entries: { key: string; pttl: number; dump: Buffer }[];
}

export class RedisFailover {
  readonly #redis: Redis;
  readonly #pattern: string;

  constructor(url: string, policy: string, version = 1) {
    this.#redis = new Redis(url, { maxRetriesPerRequest: 2, lazyConnect: true });
    // Failures reach the caller as rejected commands; the connection's own error events add nothing.
    this.#redis.on('error', () => undefined);
    this.#pattern = bucketKey(version, '*', policy);
  }

  async #keys(): Promise<string[]> {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await this.#redis.scan(cursor, 'MATCH', this.#pattern, 'COUNT', 1000);
      keys.push(...batch);
      cursor = next;
    } while (cursor !== '0');
    return keys;
  }

  /** The policy's keys now. */
  async snapshot(): Promise<KeySnapshot> {
    const keys = await this.#keys();
    const takenAt = performance.now();
    const pipeline = this.#redis.pipeline();
    for (const key of keys) pipeline.pttl(key).dumpBuffer(key);
    const replies = (await pipeline.exec()) ?? [];
    const entries: KeySnapshot['entries'] = [];
    keys.forEach((key, i) => {
      const pttl = replies[2 * i]?.[1];
      const dump = replies[2 * i + 1]?.[1];
      if (typeof pttl === 'number' && pttl > 0 && Buffer.isBuffer(dump)) entries.push({ key, pttl, dump });
    });
    return { takenAt, entries };
  }

  /**
   * Fail over: drop the policy's keys and put back `snapshot`'s (each with the time to live it had left, those
   * expired since left out), or nothing. Returns how many keys the replica holds.
   */
  async failover(snapshot: KeySnapshot | undefined): Promise<number> {
    const keys = await this.#keys();
    const pipeline = this.#redis.pipeline();
    if (keys.length > 0) pipeline.del(...keys);
    let restored = 0;
    if (snapshot !== undefined) {
      const elapsed = performance.now() - snapshot.takenAt;
      for (const e of snapshot.entries) {
        const ttl = Math.floor(e.pttl - elapsed);
        if (ttl <= 0) continue;
        pipeline.restore(e.key, ttl, e.dump, 'REPLACE');
        restored++;
      }
    }
    const replies = (await pipeline.exec()) ?? [];
    const failed = replies.find(([error]) => error !== null);
    if (failed !== undefined) throw failed[0]!;
    return restored;
  }

  async close(): Promise<void> {
    await this.#redis.quit().catch(() => this.#redis.disconnect());
  }
}
