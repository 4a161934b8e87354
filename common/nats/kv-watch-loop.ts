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
  /**
   * The initial load is given up (the watch stopped, reported through `onFailure`, tried again) when no entry
   * arrives for this long before it completes, ms. Default: twice `timeoutMs`, at least 2 s.
   */
  stallMs?: number;
  /** Opens the bucket and its watch (tests give a double; by default JetStream's KV). */
  open?: (bucket: string, timeoutMs: number) => Promise<OpenedWatch>;
}

/**
 * A bucket's watch as the loop uses it: the entries, and how many values the bucket held and its last sequence, read
 * once the watch's consumer existed.
 */
export interface OpenedWatch {
  values: number;
  lastSeq: number;
  watch: AsyncIterable<KvWatchEntry> & { stop(): void };
}

/** The initial load did not complete: no entry for `stallMs`. */
export class InitialLoadStalled extends Error {
  constructor(bucket: string, entries: number, values: number, stallMs: number) {
    super(
      `the initial load of ${bucket} stalled: ${String(entries)} entries of about ${String(values)} in, none for ${String(stallMs)} ms; watching again`,
    );
    this.name = 'InitialLoadStalled';
  }
}

function openKv(nc: NatsConnection): (bucket: string, timeoutMs: number) => Promise<OpenedWatch> {
  return async (bucket, timeoutMs) => {
    const js = jetstream(nc, { timeout: timeoutMs });
    const kv = await new Kvm(js).open(bucket, { bindOnly: true, timeout: timeoutMs });
    const watch = await kv.watch();
    // Read after the watch's consumer exists: every message it will deliver up to this sequence was stored by then.
    try {
      const status = await kv.status();
      return { values: status.values, lastSeq: status.streamInfo.state.last_seq, watch };
    } catch (error) {
      watch.stop();
      throw error;
    }
  };
}

export class KvWatchLoop {
  readonly #options: KvWatchLoopOptions;
  readonly #status: AsyncIterable<{ type: string }> & { stop?: () => void };
  #watch: { stop(): void } | undefined;
  #wake: (() => void) | undefined;
  #closed = false;
  readonly #loop: Promise<void>;
  readonly #open: (bucket: string, timeoutMs: number) => Promise<OpenedWatch>;
  #loads = 0;
  #stalls = 0;
  #loading: { since: number; entries: number; values: number } | undefined;
  #lastFailure: string | undefined;

  constructor(options: KvWatchLoopOptions) {
    this.#options = options;
    this.#open = options.open ?? openKv(options.nc);
    // The client's status stream is a QueuedIterator (stop() ends it), typed as a plain AsyncIterable.
    this.#status = options.nc.status();
    void this.#followStatus();
    this.#loop = this.#run();
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Where the loop stands, for a readiness message: loading (how far, how long) or how many loads completed. */
  describe(): string {
    const stalls =
      (this.#stalls === 0 ? '' : `, ${String(this.#stalls)} stalled`) +
      (this.#lastFailure === undefined ? '' : `, last failure: ${this.#lastFailure}`);
    const loading = this.#loading;
    if (loading === undefined)
      return `${String(this.#loads)} loads of ${this.#options.bucket} completed${stalls}`;
    return `loading ${this.#options.bucket} for ${String(Date.now() - loading.since)} ms: ${String(loading.entries)} entries of about ${String(loading.values)}, ${String(this.#loads)} loads completed${stalls}`;
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
    const { bucket, timeoutMs, retryMs, maxRetryMs } = this.#options;
    const stallMs = this.#options.stallMs ?? Math.max(2 * timeoutMs, 2000);
    let delay = retryMs;
    while (!this.#closed) {
      let stall: NodeJS.Timeout | undefined;
      try {
        const { values, lastSeq, watch } = await this.#open(bucket, timeoutMs);
        this.#watch = watch;
        if (this.#closed) {
          watch.stop();
          break;
        }
        const session = this.#options.session();
        let initial = true;
        const loading = { since: Date.now(), entries: 0, values };
        let stalled = false;
        const complete = (revision: number): void => {
          initial = false;
          clearTimeout(stall);
          this.#loading = undefined;
          this.#loads += 1;
          session.loaded(Math.max(revision, lastSeq));
        };
        // No entry for `stallMs` before the load completes: stop and watch again (a consumer that never
        // delivers, or a pending count that never reaches zero, must not keep the caller loading forever).
        const armStall = (): void => {
          clearTimeout(stall);
          stall = setTimeout(() => {
            stalled = true;
            watch.stop();
          }, stallMs);
        };
        // An empty bucket sends nothing: the load is complete at once.
        if (values === 0) complete(lastSeq);
        else {
          this.#loading = loading;
          armStall();
        }
        for await (const entry of watch) {
          session.entry(entry, initial);
          if (!initial) continue;
          loading.entries += 1;
          // The watch delivers in sequence order (the latest value of every key as its consumer was made, then every
          // write since), so the load is complete at the first entry at or past the bucket's last sequence as read
          // once the consumer existed: every value it held at its creation, and every write until that read, has
          // come by then. Not earlier: a pending count of zero can rise again under concurrent writes, and the
          // library's count (`isUpdate`) is reached too soon when its ordered consumer is recreated mid-load and
          // delivers every revision after its cursor. An entry that never comes (removed meanwhile) is a stall.
          if (entry.revision >= lastSeq) complete(entry.revision);
          else armStall();
        }
        clearTimeout(stall);
        if (initial) {
          this.#loading = undefined;
          if (stalled) {
            this.#stalls += 1;
            throw new InitialLoadStalled(bucket, loading.entries, values, stallMs);
          }
        } else delay = retryMs;
      } catch (error) {
        clearTimeout(stall);
        this.#loading = undefined;
        if (this.#closed) break;
        this.#lastFailure = error instanceof Error ? error.message : String(error);
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
