/** Live keys of each region's Redis (DBSIZE), sampled during a replay for `peakKeys`. */
import { Redis } from 'ioredis';

/** DBSIZE of each Redis (undefined entries skipped): live keys now, by index. */
export class KeyCounter {
  readonly #clients: (Redis | undefined)[];

  constructor(urls: readonly (string | undefined)[]) {
    this.#clients = urls.map((u) => {
      if (u === undefined) return undefined;
      const client = new Redis(u, { maxRetriesPerRequest: 1, lazyConnect: true });
      // A Redis that does not answer shows as an undefined count (below); its connection errors say no more.
      client.on('error', () => undefined);
      return client;
    });
  }

  /** Keys of each Redis now; undefined for a region without one or whose Redis did not answer. */
  count(): Promise<(number | undefined)[]> {
    return Promise.all(
      this.#clients.map((c) =>
        c === undefined ? Promise.resolve(undefined) : c.dbsize().catch(() => undefined),
      ),
    );
  }

  async close(): Promise<void> {
    await Promise.all(
      this.#clients.map((c) =>
        c === undefined
          ? Promise.resolve()
          : c.quit().then(
              () => undefined,
              () => c.disconnect(),
            ),
      ),
    );
  }
}
