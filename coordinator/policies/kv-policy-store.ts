/**
 * Policies in a NATS JetStream KV bucket (key rules in core/wire/kv.ts). Every write is conditional on the
 * revision it read (`kv.create` / `kv.update(key, value, revision)` / `delete` with `previousSeq`), so a
 * concurrent writer is detected rather than overwritten; an `If-Match` from the client narrows that revision to
 * the one it saw. Writes from this process are serialized, which keeps the policy cap exact and the change
 * events in write order (one active coordinator writes; agents only read).
 */
import {
  DeliverPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamClient,
} from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import {
  policyView,
  type AuditRecord,
  type BudgetPatch,
  type PolicyBody,
  type PolicyChangeKind,
} from '../../core/wire/admin.js';
import type { Clock } from '../../core/clock.js';
import { Policy } from '../../core/policy/policy.js';
import { MAX_POLICY_VERSION, nextVersion, type VersionOutcome } from '../../core/policy/policy-version.js';
import { policyKey, policyNameFromKey } from '../../core/wire/kv.js';
import type { AuditTrail } from '../audit/audit-trail.js';
import type { KvGuard } from '../nats/kv-guard.js';
import { Errors, withFieldProblems } from '../errors.js';
import type { CoordinatorMetrics } from '../metrics.js';
import type { Logger } from '../ports.js';
import type {
  PolicyChange,
  PolicyStore,
  PutResult,
  StoredPolicy,
  StoredSpec,
  WriteContext,
} from './policy-store.js';
import { failedPrecondition } from './preconditions.js';
import { policyBodyFor, validateSpec } from './validate.js';

export interface KvPolicyStoreOptions {
  kv: KV;
  /** The JetStream client the bucket was opened with, for listings. */
  js: JetStreamClient;
  /** Name of the bucket (`kvNames(ns).policies`). */
  bucket: string;
  audit: AuditTrail;
  /** Configured regions: a policy's `homeRegion` must be one of them. */
  regions: readonly string[];
  /** Most policies the bucket may hold. */
  maxPolicies: number;
  clock: Clock;
  metrics: CoordinatorMetrics;
  log: Logger;
  /** Deadline of one full listing, milliseconds. Default 10 s. */
  listTimeoutMs?: number;
  /**
   * Checks that nobody else writes the bucket (see kv-guard.ts); its `restore` should call `restore` here.
   * Without one, foreign writes go unnoticed.
   */
  guard?: KvGuard;
}

/** The latest message of one key, as a listing or a get reads it. */
export interface RawEntry {
  readonly key: string;
  readonly revision: number;
  readonly operation: string;
  json(): unknown;
  string(): string;
}

/** What the bucket holds under a key right now. */
interface Current {
  readonly revision: number;
  /** Absent when the entry does not parse as a policy (counted and logged; a write may replace it). */
  readonly stored: StoredPolicy | undefined;
}

/** Unconditional writes retry this often when another writer slips in between read and write. */
const WRITE_ATTEMPTS = 3;
const AUDIT_ATTEMPTS = 3;

export class KvPolicyStore implements PolicyStore {
  readonly #kv: KV;
  readonly #js: JetStreamClient;
  readonly #bucket: string;
  /** Live policies as last counted; kept exact by this process's serialized writes, rescanned at the cap. */
  #count = 0;
  readonly #audit: AuditTrail;
  readonly #bodySchema: ReturnType<typeof policyBodyFor>;
  readonly #maxPolicies: number;
  readonly #clock: Clock;
  readonly #metrics: CoordinatorMetrics;
  readonly #log: Logger;
  readonly #listTimeoutMs: number;
  readonly #listeners = new Set<(change: PolicyChange) => void>();
  readonly #guard: KvGuard | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  /** What `init` read, for `takeOpened` (once; any write drops it). */
  #opened: RawEntry[] | undefined;

  constructor(options: KvPolicyStoreOptions) {
    this.#kv = options.kv;
    this.#js = options.js;
    this.#bucket = options.bucket;
    this.#audit = options.audit;
    this.#bodySchema = policyBodyFor(options.regions);
    this.#maxPolicies = options.maxPolicies;
    this.#clock = options.clock;
    this.#metrics = options.metrics;
    this.#log = options.log;
    this.#listTimeoutMs = options.listTimeoutMs ?? 10_000;
    this.#guard = options.guard;
  }

  /**
   * Count the stored policies, for the cap and the gauge; what the bucket holds now is taken as ours. `entries`:
   * the latest entry of every key (deletion markers included), read already (a start reads them without a
   * consumer: coordinator/nats/kv-read.ts); without them the bucket is listed.
   */
  async init(entries?: readonly RawEntry[]): Promise<void> {
    this.#opening(entries ?? (await this.#kvCall('count', () => this.#scan())));
  }

  #opening(entries: readonly RawEntry[]): void {
    this.#setCount(entries.filter((e) => e.operation === 'PUT').length);
    for (const e of entries) this.#guard?.seed(e.key, e.operation === 'PUT' ? e.string() : null, e.revision);
    this.#opened = [...entries];
  }

  takeOpened(): StoredPolicy[] | undefined {
    const entries = this.#opened;
    this.#opened = undefined;
    return entries === undefined ? undefined : this.#valid(entries);
  }

  /**
   * Put back what this store last wrote under `key` (delete the key when it wrote nothing there): the guard found
   * an entry written by someone else. Serialized with every other write.
   */
  restore(key: string, payload: string | null): Promise<void> {
    return this.#exclusive(async () => {
      this.#guard?.writing(key, payload);
      try {
        if (payload === null) {
          await this.#kvCall('restore', () => this.#kv.delete(key));
          this.#guard?.wrote(key, undefined);
        } else {
          const revision = await this.#kvCall('restore', () => this.#kv.put(key, payload));
          this.#guard?.wrote(key, revision);
        }
      } catch (error) {
        this.#guard?.failed(key);
        throw error;
      }
      await this.#recount();
    });
  }

  async list(): Promise<StoredPolicy[]> {
    return this.#valid(await this.#kvCall('list', () => this.#scan()));
  }

  /** The entries that hold a valid policy, decoded, sorted by name. */
  #valid(entries: readonly RawEntry[]): StoredPolicy[] {
    const out: StoredPolicy[] = [];
    for (const e of entries) {
      if (e.operation !== 'PUT') continue;
      const stored = this.#decode(e);
      if (stored !== undefined) out.push(stored);
    }
    return out.sort((a, b) => (a.policy.name < b.policy.name ? -1 : a.policy.name > b.policy.name ? 1 : 0));
  }

  async get(name: string): Promise<StoredPolicy | undefined> {
    return (await this.#current(name))?.stored;
  }

  put(name: string, body: PolicyBody, ctx: WriteContext): Promise<PutResult> {
    const checked = validateSpec(name, body, this.#bodySchema);
    if (!checked.ok) {
      return Promise.reject(
        withFieldProblems(new Errors.VALIDATION(summary(checked.problems)), checked.problems),
      );
    }
    return this.#exclusive(async () => {
      for (let attempt = 1; ; attempt++) {
        const current = await this.#current(name);
        this.#check(ctx, current?.revision);
        // The version never goes down, and moves up when the units change (core/policy/policy-version.ts).
        const { spec, policy, bump } = versioned(checked.spec, current?.stored?.policy);
        if (current?.stored !== undefined && sameSpec(current.stored.spec, spec)) {
          return { created: false, changed: false, stored: current.stored };
        }
        // Another writer may have deleted some: recount before refusing.
        if (
          current === undefined &&
          this.#count >= this.#maxPolicies &&
          (await this.#recount()) >= this.#maxPolicies
        ) {
          throw new Errors.POLICY_LIMIT(this.#maxPolicies);
        }
        const revision = await this.#write(name, spec, current?.revision);
        if (revision === undefined) {
          if (ctx.precondition?.ifMatch !== undefined || attempt >= WRITE_ATTEMPTS) {
            throw this.#raced(name, ctx);
          }
          continue;
        }
        const stored: StoredPolicy = { spec, policy, revision };
        const before = current?.stored?.policy ?? null;
        const kind: PolicyChangeKind = current === undefined ? 'create' : 'replace';
        if (current === undefined) this.#setCount(this.#count + 1);
        await this.#changed(kind, name, before, policy, revision, ctx, bump);
        return { created: current === undefined, changed: true, stored };
      }
    });
  }

  patchBudget(name: string, patch: BudgetPatch, ctx: WriteContext): Promise<StoredPolicy> {
    return this.#exclusive(async () => {
      for (let attempt = 1; ; attempt++) {
        const current = await this.#current(name);
        if (current?.stored === undefined) throw new Errors.POLICY_NOT_FOUND(name);
        this.#check(ctx, current.revision);
        const { name: _name, ...fields } = current.stored.spec;
        const checked = validateSpec(name, { ...fields, ...patch }, this.#bodySchema);
        if (!checked.ok) {
          throw withFieldProblems(new Errors.INVALID_POLICY(summary(checked.problems)), checked.problems);
        }
        if (sameSpec(current.stored.spec, checked.spec)) return current.stored;
        const revision = await this.#write(name, checked.spec, current.revision);
        if (revision === undefined) {
          if (ctx.precondition?.ifMatch !== undefined || attempt >= WRITE_ATTEMPTS) {
            throw this.#raced(name, ctx);
          }
          continue;
        }
        const policy = Policy.parse(checked.spec);
        await this.#changed('budget', name, current.stored.policy, policy, revision, ctx);
        return { spec: checked.spec, policy, revision };
      }
    });
  }

  delete(name: string, ctx: WriteContext): Promise<{ revision: number; before: StoredPolicy }> {
    return this.#exclusive(async () => {
      for (let attempt = 1; ; attempt++) {
        const current = await this.#current(name);
        if (current?.stored === undefined) throw new Errors.POLICY_NOT_FOUND(name);
        this.#check(ctx, current.revision);
        const key = policyKey(name);
        this.#guard?.writing(key, null);
        const deleted = await this.#kvCall('delete', async () => {
          try {
            await this.#kv.delete(key, { previousSeq: current.revision });
            return true;
          } catch (error) {
            if (isWrongLastSequence(error)) return false;
            throw error;
          }
        }).catch((error: unknown) => {
          this.#guard?.failed(key);
          throw error;
        });
        if (!deleted) {
          this.#guard?.failed(key);
          if (ctx.precondition?.ifMatch !== undefined || attempt >= WRITE_ATTEMPTS) {
            throw this.#raced(name, ctx);
          }
          continue;
        }
        // The delete marker's revision: read back under the write lock, so it is ours unless another
        // process wrote in between (then the newer revision is the one worth recording). The delete landed
        // whatever this read does: a failed read falls back to an estimate rather than failing a done delete,
        // which would leave it unaudited and unannounced.
        const marker = await this.#kv.get(key).catch((error: unknown) => {
          this.#metrics.kvErrors.inc({ op: 'get' });
          this.#log.warn({ err: error, op: 'get' }, 'could not read back a deletion marker');
          return null;
        });
        const revision = marker?.revision ?? current.revision + 1;
        this.#guard?.wrote(key, revision);
        this.#setCount(this.#count - 1);
        await this.#changed('delete', name, current.stored.policy, null, revision, ctx);
        return { revision, before: current.stored };
      }
    });
  }

  restoreBackup(
    specs: readonly StoredSpec[],
    audit: readonly AuditRecord[],
    ctx: WriteContext,
  ): Promise<void> {
    // One critical section from the emptiness check to the last create: two restores (or a restore and a PUT)
    // never interleave, so the one that comes second finds policies and writes nothing.
    return this.#exclusive(async () => {
      const entries = await this.#kvCall('list', () => this.#scan());
      if (this.#valid(entries).length > 0) throw new Errors.RESTORE_NOT_EMPTY();
      // Keys holding an entry that is not a policy (counted as bad entries) are written over, as a PUT does.
      const revisions = new Map(entries.filter((e) => e.operation === 'PUT').map((e) => [e.key, e.revision]));
      this.#setCount(revisions.size);
      try {
        for (const record of audit) await this.#audit.record(record, { imported: true });
      } catch (error) {
        throw new Errors.STORE_UNAVAILABLE({ cause: error });
      }
      for (const checked of specs) {
        const { name } = checked;
        const current = revisions.get(policyKey(name));
        const { spec, policy, bump } = versioned(checked, undefined);
        const revision = await this.#write(name, spec, current);
        // Only another process writing the bucket moves a key under this lock.
        if (revision === undefined) throw new Errors.CONFLICT(name);
        if (current === undefined) this.#setCount(this.#count + 1);
        await this.#changed(
          'create',
          name,
          null,
          policy,
          revision,
          {
            ...ctx,
            requestId: perPolicyRequestId(ctx.requestId, name),
            precondition: undefined,
          },
          bump,
        );
      }
    });
  }

  onChange(listener: (change: PolicyChange) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #check(ctx: WriteContext, current: number | undefined): void {
    if (ctx.precondition === undefined) return;
    const failed = failedPrecondition(ctx.precondition, current);
    if (failed !== undefined) throw new Errors.PRECONDITION_FAILED(failed);
  }

  #raced(name: string, ctx: WriteContext): Error {
    return ctx.precondition?.ifMatch !== undefined
      ? new Errors.PRECONDITION_FAILED('If-Match: the policy changed while this request was being applied')
      : new Errors.CONFLICT(name);
  }

  /** Write `spec` if the key is still at `revision` (absent: still absent). `undefined` when it moved. */
  async #write(name: string, spec: StoredSpec, revision: number | undefined): Promise<number | undefined> {
    const key = policyKey(name);
    const value = JSON.stringify(spec);
    this.#guard?.writing(key, value);
    let written: number | undefined;
    try {
      written = await this.#kvCall(revision === undefined ? 'create' : 'update', async () => {
        try {
          return revision === undefined
            ? await this.#kv.create(key, value)
            : await this.#kv.update(key, value, revision);
        } catch (error) {
          if (isWrongLastSequence(error)) return undefined;
          throw error;
        }
      });
    } finally {
      if (written === undefined) this.#guard?.failed(key);
      else this.#guard?.wrote(key, written);
    }
    return written;
  }

  async #current(name: string): Promise<Current | undefined> {
    const entry = await this.#kvCall('get', () => this.#kv.get(policyKey(name)));
    if (entry === null || entry.operation !== 'PUT') return undefined;
    return { revision: entry.revision, stored: this.#decode(entry) };
  }

  #decode(entry: RawEntry): StoredPolicy | undefined {
    const name = policyNameFromKey(entry.key);
    let value: unknown;
    try {
      value = entry.json();
    } catch {
      value = undefined;
    }
    const parsed = Policy.safeParse(value);
    if (name === undefined || !parsed.success || parsed.data.name !== name) {
      this.#metrics.badEntries.inc({ where: 'policies' });
      this.#log.warn(
        { key: entry.key, revision: entry.revision },
        'skipped a policy entry that is not a valid policy',
      );
      return undefined;
    }
    const { name: _n, ...fields } = value as StoredSpec;
    const spec = { name, ...fields } as StoredSpec;
    return { spec, policy: parsed.data, revision: entry.revision };
  }

  /**
   * The latest message of every key, deletions included, through one ordered consumer that is deleted
   * afterwards (a KV watch would leave its consumer on the server for minutes after every listing).
   */
  async #scan(): Promise<RawEntry[]> {
    const status = await this.#kv.status();
    if (status.values === 0) return [];
    const prefix = `$KV.${this.#bucket}.`;
    const consumer = await this.#js.consumers.get(status.streamInfo.config.name, {
      filter_subjects: `${prefix}>`,
      deliver_policy: DeliverPolicy.LastPerSubject,
      inactive_threshold: 30_000,
    });
    const out: RawEntry[] = [];
    const deadline = performance.now() + this.#listTimeoutMs;
    try {
      for (let done = false; !done;) {
        if (performance.now() > deadline) throw new Error('listing the policies bucket timed out');
        const batch = await consumer.fetch({ max_messages: 256, expires: 2000 });
        let got = 0;
        for await (const m of batch) {
          got++;
          out.push({
            key: m.subject.slice(prefix.length),
            revision: m.seq,
            operation: m.headers?.get('KV-Operation') || 'PUT',
            json: () => m.json(),
            string: () => m.string(),
          });
          if (m.info.pending === 0) {
            done = true;
            break;
          }
        }
        if (got === 0) done = true;
      }
    } finally {
      await consumer.delete().catch(() => undefined);
    }
    return out;
  }

  async #recount(): Promise<number> {
    const entries = await this.#kvCall('count', () => this.#scan());
    this.#setCount(entries.filter((e) => e.operation === 'PUT').length);
    return this.#count;
  }

  #setCount(n: number): void {
    this.#count = n;
    this.#metrics.policies.set(n);
  }

  async #changed(
    kind: PolicyChangeKind,
    name: string,
    before: Policy | null,
    after: Policy | null,
    revision: number,
    ctx: WriteContext,
    bump?: VersionOutcome['bump'],
  ): Promise<void> {
    const at = this.#clock.now();
    this.#metrics.policyChanges.inc({ kind });
    const record: AuditRecord = {
      at: new Date(at).toISOString(),
      actor: ctx.actor,
      action: kind,
      policy: name,
      revision,
      before: before === null ? null : policyView(before),
      after: after === null ? null : policyView(after),
      requestId: ctx.requestId,
      ...(ctx.source !== undefined ? { source: ctx.source } : {}),
      ...(bump !== undefined ? { versionBump: bump } : {}),
    };
    await this.#appendAudit(record);
    const change: PolicyChange = { kind, name, before, after, revision, at };
    for (const listener of this.#listeners) {
      try {
        listener(change);
      } catch (error) {
        this.#log.error({ err: error, policy: name, kind }, 'a policy change listener threw');
      }
    }
  }

  /**
   * The change is already stored when its record is written, so a failure here does not undo it or fail the
   * request (a retry would then hit a moved ETag): the record is retried (deduplicated by message id), then
   * logged in full and counted.
   */
  async #appendAudit(record: AuditRecord): Promise<void> {
    for (let attempt = 1; attempt <= AUDIT_ATTEMPTS; attempt++) {
      try {
        await this.#audit.record(record);
        return;
      } catch (error) {
        this.#metrics.kvErrors.inc({ op: 'audit' });
        if (attempt === AUDIT_ATTEMPTS) {
          this.#metrics.auditFailures.inc();
          this.#log.error({ err: error, audit: record }, 'could not write an audit record');
          return;
        }
        await new Promise((r) => setTimeout(r, 50 * attempt));
      }
    }
  }

  async #kvCall<T>(op: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (error) {
      this.#metrics.kvErrors.inc({ op });
      this.#log.warn({ err: error, op }, 'policy store operation failed');
      throw new Errors.STORE_UNAVAILABLE({ cause: error });
    }
  }

  #exclusive<T>(fn: () => Promise<T>): Promise<T> {
    // A write makes what the store read when it opened out of date.
    this.#opened = undefined;
    const run = this.#queue.then(fn, fn);
    this.#queue = run.catch(() => undefined);
    return run;
  }
}

function isWrongLastSequence(error: unknown): boolean {
  return (
    error instanceof JetStreamApiError &&
    (error.code === JetStreamApiCodes.StreamWrongLastSequence ||
      error.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  );
}

/**
 * `spec` with the version a write over `before` stores (never lower than the stored one; the next one when
 * the units change), the policy it parses to, and the bump if there is one. 422 past the version cap.
 */
function versioned(
  spec: StoredSpec,
  before: Policy | undefined,
): { spec: StoredSpec; policy: Policy; bump: VersionOutcome['bump'] } {
  const requested = Policy.parse(spec);
  const outcome = nextVersion(before, requested);
  if (outcome.version > MAX_POLICY_VERSION) {
    throw withFieldProblems(
      new Errors.INVALID_POLICY(
        `version: the units changed and the version is already ${MAX_POLICY_VERSION}`,
      ),
      [{ path: 'version', message: `a units change needs a version above ${MAX_POLICY_VERSION}` }],
    );
  }
  if (outcome.version === requested.version) return { spec, policy: requested, bump: outcome.bump };
  const moved = { ...spec, version: outcome.version };
  return { spec: moved, policy: Policy.parse(moved), bump: outcome.bump };
}

/** Longest request id an audit record carries (AuditRecord in core/wire/admin.ts). */
const MAX_AUDIT_REQUEST_ID = 128;

/**
 * `<request id>:<policy name>`, the request id cut so the whole fits an audit record: the request id may be the
 * client's (up to 128 characters) and the name up to 64, and a longer one would be skipped by every read.
 */
function perPolicyRequestId(requestId: string, name: string): string {
  return `${requestId.slice(0, MAX_AUDIT_REQUEST_ID - 1 - name.length)}:${name}`;
}

function sameSpec(a: StoredSpec, b: StoredSpec): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

function summary(problems: readonly { path: string; message: string }[]): string {
  return problems.map((p) => (p.path === '' ? p.message : `${p.path}: ${p.message}`)).join('; ');
}
