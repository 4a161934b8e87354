/**
 * The coordinator is the only writer of its policies and allocations buckets: NATS permissions say so, and this
 * guard checks it. It watches a bucket and compares every entry with what this process wrote there: a revision
 * it wrote, or the payload it last wrote to that key (a watch may show a write before the write's own reply
 * arrives). Anything else is foreign (a leaked credential, an operator with the `nats` CLI, a second
 * coordinator): it is counted (`qp_coord_kv_foreign_writes_total{bucket}`), logged, recorded in the audit trail
 * (action `restore`, actor system/kv-guard) and undone by the owner's `restore`, which writes its own value back
 * (or deletes a key it never wrote).
 *
 * What the bucket holds when the coordinator starts is taken as its own (`seed`): a forgery made while no
 * coordinator ran is not detected. The watch is rebuilt after every reconnect, and the reload checks every entry.
 */
import type { KvWatchEntry } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { Counter, type Registry } from 'prom-client';
import type { AuditRecord } from '../../core/wire/admin.js';
import type { Clock } from '../../core/clock.js';
import { PolicyName } from '../../core/policy/policy.js';
import { policyNameFromKey } from '../../core/wire/kv.js';
import { KvWatchLoop } from '../../common/nats/kv-watch-loop.js';
import type { AuditTrail } from '../audit/audit-trail.js';
import type { Logger } from '../ports.js';

/** Revisions remembered per key: a watch is at most a few writes behind. */
const REMEMBERED_REVISIONS = 16;
const METRIC = 'qp_coord_kv_foreign_writes_total';

export interface KvGuardOptions {
  nc: NatsConnection;
  /** The bucket's name, also the metric's `bucket` label. */
  bucket: string;
  timeoutMs: number;
  registry: Registry;
  log: Logger;
  clock: Clock;
  audit?: AuditTrail | undefined;
  /**
   * Put this process's own value of `key` back: `payload` is what it last wrote there (null: nothing, or a
   * deletion), for an owner that keeps no other copy.
   */
  restore(key: string, payload: string | null): Promise<void>;
}

interface Own {
  /** What this process last wrote (or is writing); null: it wants the key absent. */
  payload: string | null;
  /** What it wrote before the write under way, for `failed`. */
  previous: string | null;
  revisions: number[];
}

/** The counter of foreign writes, shared by every guard on one registry. */
function foreignWrites(registry: Registry): Counter<'bucket'> {
  const existing = registry.getSingleMetric(METRIC);
  if (existing !== undefined) return existing as Counter<'bucket'>;
  return new Counter({
    name: METRIC,
    help: 'KV entries the coordinator did not write (a revision it does not know), found and restored, by bucket.',
    labelNames: ['bucket'],
    registers: [registry],
  });
}

export class KvGuard {
  readonly #options: KvGuardOptions;
  readonly #own = new Map<string, Own>();
  readonly #counter: Counter<'bucket'>;
  #loop: KvWatchLoop | undefined;
  #restoring: Promise<void> = Promise.resolve();
  /** Foreign entries found, for tests and diagnostics. */
  found = 0;

  constructor(options: KvGuardOptions) {
    this.#options = options;
    this.#counter = foreignWrites(options.registry);
    this.#counter.inc({ bucket: options.bucket }, 0);
  }

  /** What the bucket held at start: taken as this process's own. */
  seed(key: string, payload: string | null, revision: number): void {
    this.#own.set(key, { payload, previous: payload, revisions: [revision] });
  }

  /** This process is about to write `payload` to `key` (null: delete it). */
  writing(key: string, payload: string | null): void {
    const own = this.#own.get(key);
    if (own === undefined) this.#own.set(key, { payload, previous: null, revisions: [] });
    else {
      own.previous = own.payload;
      own.payload = payload;
    }
  }

  /** This process's write to `key` landed, at `revision` when the store says which. */
  wrote(key: string, revision: number | undefined): void {
    const own = this.#own.get(key);
    if (own === undefined) return;
    own.previous = own.payload;
    if (revision === undefined) return;
    own.revisions.push(revision);
    if (own.revisions.length > REMEMBERED_REVISIONS) own.revisions.shift();
  }

  /** The write announced by `writing` did not land: the key holds what it held before. */
  failed(key: string): void {
    const own = this.#own.get(key);
    if (own !== undefined) own.payload = own.previous;
  }

  start(): void {
    this.#loop = new KvWatchLoop({
      nc: this.#options.nc,
      bucket: this.#options.bucket,
      timeoutMs: this.#options.timeoutMs,
      retryMs: 250,
      maxRetryMs: 5000,
      session: () => ({ loaded: () => undefined, entry: (entry) => this.#check(entry) }),
      onFailure: (error) =>
        this.#options.log.warn(
          { err: error, bucket: this.#options.bucket },
          'kv guard: watch failed; retrying',
        ),
    });
  }

  /** Stop watching; waits for restores under way. */
  async close(): Promise<void> {
    await this.#loop?.close();
    await this.#restoring;
  }

  #check(entry: KvWatchEntry): void {
    const own = this.#own.get(entry.key);
    if (own?.revisions.includes(entry.revision)) return;
    const payload = entry.operation === 'PUT' ? entry.string() : null;
    if ((own?.payload ?? null) === payload) return;
    this.found++;
    const { bucket, log } = this.#options;
    this.#counter.inc({ bucket });
    log.warn(
      { bucket, key: entry.key, revision: entry.revision, operation: entry.operation },
      'kv guard: an entry this coordinator did not write; restoring its own',
    );
    this.#restoring = this.#restoring.then(() => this.#restore(entry));
  }

  async #restore(entry: KvWatchEntry): Promise<void> {
    const { bucket, log, audit, clock } = this.#options;
    try {
      await this.#options.restore(entry.key, this.#own.get(entry.key)?.payload ?? null);
    } catch (error) {
      log.error({ err: error, bucket, key: entry.key }, 'kv guard: restoring an entry failed');
    }
    const policy = PolicyName.safeParse(policyNameFromKey(entry.key) ?? '');
    if (audit === undefined || !policy.success) return;
    const record: AuditRecord = {
      at: new Date(clock.now()).toISOString(),
      actor: { role: 'system', name: 'kv-guard' },
      action: 'restore',
      policy: policy.data,
      revision: entry.revision,
      before: null,
      after: null,
      requestId: `restore:${bucket}:${entry.revision}`,
      restored: { bucket, operation: entry.operation === 'PUT' ? 'put' : 'delete' },
    };
    await audit.record(record).catch((error: unknown) => {
      log.error({ err: error, audit: record }, 'kv guard: could not record a restore in the audit trail');
    });
  }
}
