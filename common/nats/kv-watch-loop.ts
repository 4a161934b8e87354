/**
 * A JetStream KV watch that survives anything: open the bucket (bind only), load every entry, follow updates;
 * when the watch ends or fails, retry with backoff; after every NATS reconnect, start over from a full load (a
 * server restart may have lost the watch's consumer without the client noticing for a minute). Shared by the
 * agent's policy source and its lease holder and by the coordinator's KV guard, which differ only in what they
 * do with the entries: it lives in common/, which both services import and which imports neither.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm, type KvWatchEntry } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';

/** One watch session: every current entry (`initial` true), then updates, in revision order. */
export interface KvWatchSession {
  /** The initial load is complete (also called at once for an empty bucket). */
  loaded(lastRevision: number): void;
  entry(entry: KvWatchEntry, initial: boolean): void;
}

export interface KvWatchLoopOptions {
  nc: NatsConnection;
  bucket: string;
  /** Deadline of one JetStream request, ms. */
  timeoutMs: number;
  /** First retry delay after a failure, doubling up to `maxRetryMs`. */
  retryMs: number;
  maxRetryMs: number;
  /** A fresh session for each (re)load. */
  session: () => KvWatchSession;
  onFailure: (error: unknown) => void;
}

export class KvWatchLoop {
  readonly #options: KvWatchLoopOptions;
  readonly #status: AsyncIterable<{ type: string }> & { stop?: () => void };
  #watch: { stop(): void } | undefined;
  #wake: (() => void) | undefined;
  #closed = false;
  readonly #loop: Promise<void>;

  constructor(options: KvWatchLoopOptions) {
    this.#options = options;
    // The client's status stream is a QueuedIterator (stop() ends it), typed as a plain AsyncIterable.
    this.#status = options.nc.status();
    void this.#followStatus();
    this.#loop = this.#run();
  }

  get closed(): boolean {
    return this.#closed;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#watch?.stop();
    this.#wake?.();
    this.#status.stop?.();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const { nc, bucket, timeoutMs, retryMs, maxRetryMs } = this.#options;
    let delay = retryMs;
    while (!this.#closed) {
      try {
        const js = jetstream(nc, { timeout: timeoutMs });
        const kv = await new Kvm(js).open(bucket, { bindOnly: true, timeout: timeoutMs });
        const status = await kv.status();
        const watch = await kv.watch();
        this.#watch = watch;
        if (this.#closed) {
          watch.stop();
          break;
        }
        const session = this.#options.session();
        let initial = true;
        // An empty bucket sends nothing: the load is complete at once.
        if (status.values === 0) {
          initial = false;
          session.loaded(status.streamInfo.state.last_seq);
        }
        for await (const entry of watch) {
          session.entry(entry, initial);
          if (initial && entry.delta === 0) {
            initial = false;
            session.loaded(Math.max(entry.revision, status.streamInfo.state.last_seq));
          }
        }
        if (!initial) delay = retryMs;
      } catch (error) {
        if (this.#closed) break;
        this.#options.onFailure(error);
      }
      if (this.#closed) break;
      await this.#sleep(delay);
      delay = Math.min(delay * 2, maxRetryMs);
    }
  }

  /** Rebuild the watch after every reconnect: the server may have lost the watch's consumer. */
  async #followStatus(): Promise<void> {
    for await (const s of this.#status) {
      if (this.#closed) return;
      if (s.type === 'reconnect') {
        this.#watch?.stop();
        this.#wake?.();
      }
    }
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
    });
  }
}
