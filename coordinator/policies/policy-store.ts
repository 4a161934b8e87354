/**
 * The policy store's contract: what the admin API calls and what the protocol engine listens to.
 */
import type {
  AuditActor,
  AuditRecord,
  BudgetPatch,
  PolicyBody,
  PolicyChangeKind,
} from '../../core/wire/admin.js';
import type { Policy } from '../../core/policy/policy.js';
import type { Precondition } from './preconditions.js';

/**
 * A policy as stored: the operator's spec (name, the fields they set, constant defaults filled; `maxCost` and
 * `idleTtlSeconds` only when set) and the policy it parses to, with its KV revision (the ETag).
 */
export interface StoredPolicy {
  readonly spec: StoredSpec;
  readonly policy: Policy;
  readonly revision: number;
}

/** The JSON value of a policy's KV entry: a valid `Policy` input. */
export type StoredSpec = PolicyBody & { readonly name: string };

/** A change the store wrote. Emitted after the write succeeded, in write order. */
export interface PolicyChange {
  readonly kind: PolicyChangeKind;
  readonly name: string;
  /** The policy before the change; null on create. */
  readonly before: Policy | null;
  /** The policy after the change; null on delete. */
  readonly after: Policy | null;
  /** KV revision the change produced. */
  readonly revision: number;
  /** Epoch milliseconds, from the store's clock. */
  readonly at: number;
}

/** Who is writing and under which preconditions. */
export interface WriteContext {
  readonly actor: AuditActor;
  readonly requestId: string;
  /** Address the request came from, for the audit trail. */
  readonly source?: string | undefined;
  readonly precondition?: Precondition | undefined;
}

/** The outcome of a PUT. */
export interface PutResult {
  /** True when no policy of that name existed. */
  readonly created: boolean;
  /** False when the stored spec was already identical: nothing written, audited or emitted. */
  readonly changed: boolean;
  readonly stored: StoredPolicy;
}

/**
 * Policies with optimistic concurrency, limits and an audit trail. Failures are `Errors.*` from
 * `coordinator/errors.ts` (not found, precondition failed, invalid, limit, store unavailable).
 */
export interface PolicyStore {
  /** Every valid policy, sorted by name. */
  list(): Promise<StoredPolicy[]>;
  /**
   * Every valid policy as the store read them when it opened, sorted by name, once: a start that needs them
   * right after opening the store uses this instead of reading the bucket again. Undefined once taken and after
   * any write of this store.
   */
  takeOpened?(): StoredPolicy[] | undefined;
  /** One policy, or `undefined`. */
  get(name: string): Promise<StoredPolicy | undefined>;
  /** Create or replace a policy. */
  put(name: string, body: PolicyBody, ctx: WriteContext): Promise<PutResult>;
  /** Change capacity and/or refill; the whole policy is re-validated and derived defaults re-derived. */
  patchBudget(name: string, patch: BudgetPatch, ctx: WriteContext): Promise<StoredPolicy>;
  /** Delete a policy; resolves with the revision of the deletion. */
  delete(name: string, ctx: WriteContext): Promise<{ revision: number; before: StoredPolicy }>;
  /**
   * Restore a backup into an empty store, under the store's write lock: when it holds no policy, append the
   * backup's `audit` records as imported (oldest first), then create each of `specs` (validated already, names
   * unique), each audited as a `create` by `ctx.actor` with request id `<ctx.requestId>:<name>` (the request id
   * cut so the whole fits an audit record's 128 characters). A store that holds a policy (another restore or a
   * PUT got there first) is `Errors.RESTORE_NOT_EMPTY` with nothing written.
   */
  restoreBackup(
    specs: readonly StoredSpec[],
    audit: readonly AuditRecord[],
    ctx: WriteContext,
  ): Promise<void>;
  /** Listen to every change this store writes. Returns a function that unsubscribes. */
  onChange(listener: (change: PolicyChange) => void): () => void;
}
