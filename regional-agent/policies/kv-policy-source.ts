/**
 * An agent's policies from the coordinator's JetStream KV bucket (core/wire/kv.ts): loaded in full, then
 * watched. Every entry is validated with `Policy` (and its key must match its name); a bad entry is counted,
 * logged and skipped, leaving that policy as it was. Deletes remove the policy.
 *
 * Recovery: the watch is rebuilt from a full reload whenever the NATS client reconnects or the watch ends, and
 * the new set replaces the old one whole, so changes (deletes included) made while the agent was cut off are
 * never missed. The connection should be made with `maxReconnectAttempts: -1` so the client keeps trying.
 */
import type { KvWatchEntry } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { Counter, Gauge, type Registry } from 'prom-client';
import { Policy } from '../../core/policy/policy.js';
import type { PolicySource } from './policy-source.js';
import {
  DEFAULT_KV_NAMESPACE,
  DEFAULT_NATS_TIMEOUT_MS,
  kvNames,
  policyNameFromKey,
} from '../../core/wire/kv.js';
import { KvWatchLoop, type KvWatchSession } from '../../common/nats/kv-watch-loop.js';

/** Why an entry was skipped. */
export type BadEntryReason = 'bad_key' | 'bad_json' | 'invalid_policy' | 'name_mismatch';

export interface KvPolicySourceOptions {
  /** JetStream namespace the coordinator writes to (its `QP_KV_NAMESPACE`). Default `qp`. */
  namespace?: string;
  /** Deadline of one JetStream request, milliseconds. Default DEFAULT_NATS_TIMEOUT_MS. */
  timeoutMs?: number;
  /** First retry delay after a failure, doubling up to `maxRetryMs`. Default 250. */
  retryMs?: number;
  /** Longest retry delay, milliseconds. Default 5000. */
  maxRetryMs?: number;
  /** When set, `ready()` rejects if no complete set was loaded by then (the source keeps trying). */
  readyTimeoutMs?: number;
  /**
   * A reload that finds neither a policy nor a deletion marker (a lost, purged or recreated bucket) replaces the
   * policies held, leaving none: default false, the last good policies stay (counted, logged). Policies deleted
   * through the admin API leave deletion markers and are dropped either way.
   */
  acceptEmptyReload?: boolean;
  /** Registers `qp_agent_policy_source_*` metrics here when given. */
  registry?: Registry;
  /** Told about skipped entries and failures; never given a policy body. */
  log?: {
    warn(obj: object, msg?: string): void;
  };
}

/** Counters of the source, for tests and status pages. */
export interface KvPolicySourceStats {
  /** Complete loads done (the first one and one per recovery). */
  readonly loads: number;
  readonly badEntries: number;
  /** Failed attempts to open, load or watch. */
  readonly failures: number;
  /** Highest KV revision applied. */
  readonly revision: number;
  /** Reloads that came back empty while policies were held, and were not applied. */
  readonly emptyReloadsKept: number;
}

interface SourceMetrics {
  badEntries: Counter<'reason'>;
  emptyKept: Counter;
  loads: Counter;
  failures: Counter;
  policies: Gauge;
}

export class KvPolicySource implements PolicySource {
  readonly #nc: NatsConnection;
  readonly #bucket: string;
  readonly #timeoutMs: number;
  readonly #retryMs: number;
  readonly #maxRetryMs: number;
  readonly #log: KvPolicySourceOptions['log'];
  readonly #metrics: SourceMetrics | undefined;
  readonly #listeners = new Set<(policies: ReadonlyMap<string, Policy>) => void>();
  #policies: ReadonlyMap<string, Policy> = new Map();
  #closed = false;
  readonly #ready: Promise<void>;
  #resolveReady!: () => void;
  #rejectReady!: (error: Error) => void;
  #isReady = false;
  #stats = { loads: 0, badEntries: 0, failures: 0, revision: 0, emptyReloadsKept: 0 };
  readonly #acceptEmptyReload: boolean;
  readonly #loop: KvWatchLoop;

  constructor(nc: NatsConnection, options: KvPolicySourceOptions = {}) {
    this.#nc = nc;
    this.#bucket = kvNames(options.namespace ?? DEFAULT_KV_NAMESPACE).policies;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_NATS_TIMEOUT_MS;
    this.#retryMs = options.retryMs ?? 250;
    this.#maxRetryMs = options.maxRetryMs ?? 5000;
    this.#log = options.log;
    this.#acceptEmptyReload = options.acceptEmptyReload ?? false;
    this.#metrics = options.registry === undefined ? undefined : sourceMetrics(options.registry);
    this.#ready = new Promise<void>((resolve, reject) => {
      this.#resolveReady = resolve;
      this.#rejectReady = reject;
    });
    this.#ready.catch(() => undefined);
    if (options.readyTimeoutMs !== undefined) {
      const timer = setTimeout(
        () =>
          this.#rejectReady(
            new Error(
              `policies not loaded from KV bucket ${this.#bucket} within ${options.readyTimeoutMs} ms`,
            ),
          ),
        options.readyTimeoutMs,
      );
      void this.#ready.finally(() => clearTimeout(timer)).catch(() => undefined);
    }
    this.#loop = new KvWatchLoop({
      nc,
      bucket: this.#bucket,
      timeoutMs: this.#timeoutMs,
      retryMs: this.#retryMs,
      maxRetryMs: this.#maxRetryMs,
      session: () => this.#session(),
      onFailure: (error) => {
        this.#stats.failures++;
        this.#metrics?.failures.inc();
        this.#log?.warn(
          { err: error, bucket: this.#bucket },
          'policy source: load or watch failed; retrying',
        );
      },
    });
  }

  current(): ReadonlyMap<string, Policy> {
    return this.#policies;
  }

  ready(): Promise<void> {
    return this.#ready;
  }

  onChange(listener: (policies: ReadonlyMap<string, Policy>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  stats(): KvPolicySourceStats {
    return { ...this.#stats };
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#rejectReady(new Error('policy source closed before it was ready'));
    await this.#loop.close();
  }

  /**
   * One load of the bucket: every current entry into a fresh set, swapped in whole once loaded (so deletes made
   * while the agent was cut off are never missed), then updates applied one by one.
   */
  #session(): KvWatchSession {
    let loading: Map<string, Policy> | undefined = new Map<string, Policy>();
    let entries = 0;
    return {
      loaded: () => {
        this.#stats.loads++;
        this.#metrics?.loads.inc();
        const next = loading ?? new Map<string, Policy>();
        loading = undefined;
        if (entries === 0 && this.#policies.size > 0 && !this.#acceptEmptyReload) {
          // Nothing at all, not even a deletion: the bucket was lost or recreated, not emptied by an operator.
          this.#stats.emptyReloadsKept++;
          this.#metrics?.emptyKept.inc();
          this.#log?.warn(
            { bucket: this.#bucket, kept: this.#policies.size },
            'policy source: a reload came back empty; keeping the last good policies',
          );
          return;
        }
        this.#swap(next);
      },
      entry: (entry, initial) => {
        if (initial && loading !== undefined) {
          entries++;
          this.#apply(loading, entry);
          return;
        }
        const next = new Map(this.#policies);
        if (this.#apply(next, entry)) this.#swap(next);
      },
    };
  }

  /** Apply one entry to `into`; true if it changed anything. */
  #apply(into: Map<string, Policy>, entry: KvWatchEntry): boolean {
    this.#stats.revision = Math.max(this.#stats.revision, entry.revision);
    const name = policyNameFromKey(entry.key);
    if (name === undefined) return this.#bad('bad_key', entry);
    if (entry.operation !== 'PUT') return into.delete(name);
    let value: unknown;
    try {
      value = entry.json();
    } catch {
      return this.#bad('bad_json', entry, name, into);
    }
    const parsed = Policy.safeParse(value);
    if (!parsed.success) return this.#bad('invalid_policy', entry, name, into);
    if (parsed.data.name !== name) return this.#bad('name_mismatch', entry, name, into);
    into.set(name, parsed.data);
    return true;
  }

  /** Count and log a bad entry; the policy keeps its last good value (carried into a reload too). */
  #bad(reason: BadEntryReason, entry: KvWatchEntry, name?: string, into?: Map<string, Policy>): boolean {
    this.#stats.badEntries++;
    this.#metrics?.badEntries.inc({ reason });
    this.#log?.warn(
      { reason, key: entry.key, revision: entry.revision },
      'policy source: skipped a bad entry',
    );
    const previous = name === undefined ? undefined : this.#policies.get(name);
    if (into !== undefined && name !== undefined && previous !== undefined && !into.has(name)) {
      into.set(name, previous);
      return true;
    }
    return false;
  }

  #swap(next: Map<string, Policy>): void {
    const changed = !samePolicies(this.#policies, next);
    this.#policies = next;
    this.#metrics?.policies.set(next.size);
    if (!this.#isReady) {
      this.#isReady = true;
      this.#resolveReady();
    }
    if (!changed) return;
    for (const listener of this.#listeners) {
      try {
        listener(next);
      } catch (error) {
        this.#log?.warn({ err: error }, 'policy source: a change listener threw');
      }
    }
  }
}

function samePolicies(a: ReadonlyMap<string, Policy>, b: ReadonlyMap<string, Policy>): boolean {
  if (a.size !== b.size) return false;
  for (const [name, p] of a) {
    const q = b.get(name);
    if (q === undefined || JSON.stringify(p) !== JSON.stringify(q)) return false;
  }
  return true;
}

function sourceMetrics(registry: Registry): SourceMetrics {
  const registers = [registry];
  return {
    badEntries: new Counter({
      name: 'qp_agent_policy_source_bad_entries_total',
      help: 'Policy entries in the KV bucket that failed validation and were skipped, by reason.',
      labelNames: ['reason'],
      registers,
    }),
    emptyKept: new Counter({
      name: 'qp_agent_policy_source_empty_reloads_kept_total',
      help: 'Reloads of the policy bucket that found neither a policy nor a deletion while policies were held; the last good policies stayed.',
      registers,
    }),
    loads: new Counter({
      name: 'qp_agent_policy_source_loads_total',
      help: 'Complete loads of the policy bucket (the first, then one per recovery).',
      registers,
    }),
    failures: new Counter({
      name: 'qp_agent_policy_source_failures_total',
      help: 'Failed attempts to open, load or watch the policy bucket.',
      registers,
    }),
    policies: new Gauge({
      name: 'qp_agent_policy_source_policies',
      help: 'Policies known from the KV bucket.',
      registers,
    }),
  };
}
