/**
 * The agent's side of the conservation protocol, pure: the shares it enforces (a ShareView), its lease, and the
 * acknowledgement watermark the coordinator waits for before it grows another region.
 *
 * - Records come from the KV watch in revision order (`applyRecord`); the agent enforces the latest one.
 * - A heartbeat reply renews the lease for `leaseMs` from when the heartbeat was *sent*, so clock offsets between
 *   agent and coordinator do not matter; it counts only once the agent has applied records up to the reply's
 *   `minRevision` (the latest shrink of its region).
 * - Lease valid: the issued share. Lapsed: min(issued, safe) — only shrink. After the grace period: the safe share.
 * - `enter()` records the revision each decision started under; `ackRevision` is the highest revision such that no
 *   decision started under an older record is still in flight. That is what the coordinator waits for.
 * - Rate-history floors: buckets last written before the latest change of a unit's share refill at most at the
 *   lowest share in force within the policy's idle TTL, so a share that dipped and rose again mints nothing.
 */
import { defaultLeaseSettings } from './settings.js';
import { monotonicOf, type Clock } from '../clock.js';
import { hasOwnKey, ownRecordOf, ownValue } from '../own-keys.js';
import type { RegionalShare, ShareView } from '../shares/shares.js';
import type { AllocationRecord, Renewal } from '../wire/protocol.js';
import {
  InFlightDecisions,
  InForceObserver,
  inForceShare,
  type InForceChange,
  type LeaseMode,
} from './in-force.js';
import { ShareHistory, unitKey } from './share-history.js';
import {
  allocationProblem,
  defaultRenewalBounds,
  renewalProblem,
  type RenewalBounds,
} from './trust-checks.js';

/** How long an agent with records but no renewal waits after start before it serves safely, ms. */
export const DEFAULT_STARTUP_WAIT_MS = 3000;

export interface AgentLeaseOptions {
  region: string;
  clock: Clock;
  /** Margin added to floor cut-offs for the offset between this clock and Redis time, ms. */
  skewMs: number;
  /**
   * With records loaded but no renewal after this long since start (coordinator unreachable), the agent serves
   * in lapsed mode: min(issued, safe), then safe after the grace period. Default DEFAULT_STARTUP_WAIT_MS.
   */
  startupWaitMs?: number | undefined;
  /** Grace period to assume before the first renewal says otherwise, ms. Default 12000. */
  graceMs?: number;
  /** What a renewal may ask at most (lease, grace, report interval). Default `defaultRenewalBounds`. */
  renewalBounds?: RenewalBounds | undefined;
}

/** What became of a renewal: taken (or held until the agent catches up), too late, or refused as out of bounds. */
export type RenewalOutcome = 'accepted' | 'stale' | 'out_of_bounds';

export type { InForceChange, LeaseMode } from './in-force.js';

const EMPTY: ReadonlySet<string> = new Set();

export class AgentLease implements ShareView {
  readonly region: string;
  readonly #clock: Clock;
  readonly #startedAt: number;
  readonly #startupWaitMs: number;
  readonly #bounds: RenewalBounds;
  #graceMs: number;

  readonly #records = new Map<string, { record: AllocationRecord; revision: number }>();
  #applied = 0;
  #recordsLoaded = false;

  /** Lease end (this clock); 0 before the first renewal. */
  #leaseUntil = 0;
  #renewed = false;
  /** A renewal waiting for the agent to catch up to its minimum revision. */
  #heldRenewal: { reply: Renewal; sentAt: number; seq: number } | undefined;
  #renewedSeq = -1;
  #lastRefusal: string | undefined;

  readonly #inFlight = new InFlightDecisions();
  /** Highest revision with a pending shrink of this region: acknowledge it as soon as possible. */
  #wantAck = 0;
  #ackSent = 0;
  #onAck: ((ackRevision: number) => void) | undefined;

  /** Share history per unit, for refill floors. */
  readonly #history: ShareHistory;
  /** Set once someone listens to in-force changes (tests, simulator). */
  #observer: InForceObserver | undefined;
  #mode: LeaseMode = 'none';
  readonly #watchCache = new WeakMap<AllocationRecord, ReadonlySet<string>>();

  constructor(options: AgentLeaseOptions) {
    this.region = options.region;
    this.#clock = options.clock;
    this.#history = new ShareHistory(options.skewMs);
    this.#startedAt = monotonicOf(options.clock);
    this.#startupWaitMs = options.startupWaitMs ?? DEFAULT_STARTUP_WAIT_MS;
    this.#graceMs = options.graceMs ?? defaultLeaseSettings.graceMs;
    this.#bounds = options.renewalBounds ?? defaultRenewalBounds;
  }

  // ---- records ----------------------------------------------------------------------------------------------

  /**
   * A KV entry: the record of `policy` at `revision`, or its deletion (null). Entries arrive in revision order.
   * A record whose shares in force sum above 1 (trust-checks.ts) is refused: the policy keeps its last good
   * record and nothing else changes. Returns why it was refused, or undefined.
   */
  applyRecord(policy: string, record: AllocationRecord | null, revision: number): string | undefined {
    const known = this.#records.get(policy);
    if (known !== undefined && revision <= known.revision) return undefined; // stale or duplicate
    const problem = record === null ? undefined : allocationProblem(record);
    if (problem !== undefined) {
      this.refusedRecords++;
      return problem;
    }
    const now = this.#clock.now();
    const mono = monotonicOf(this.#clock);
    const before = this.#records.get(policy)?.record;
    if (record === null) this.#records.delete(policy);
    else this.#records.set(policy, { record, revision });
    this.#applied = Math.max(this.#applied, revision);
    if (record !== null && hasOwnKey(record.default.pending, this.region))
      this.#wantAck = Math.max(this.#wantAck, revision);
    for (const unit of Object.values(record?.overrides ?? {})) {
      if (hasOwnKey(unit.pending, this.region)) this.#wantAck = Math.max(this.#wantAck, revision);
    }
    this.#noteIssued(policy, before, record, revision, now, mono);
    this.#releaseHeldRenewal();
    this.#maybeAck();
    return undefined;
  }

  /** Records refused because their shares in force summed above 1. */
  refusedRecords = 0;

  /** The initial snapshot of the records has been delivered. */
  recordsLoaded(): void {
    this.#recordsLoaded = true;
  }

  get appliedRevision(): number {
    return this.#applied;
  }

  // ---- lease ----------------------------------------------------------------------------------------------

  /**
   * A renewal for heartbeat `seq`, sent at `sentAt` (this clock's monotonic ms: `monotonicOf`). A reply later than one report interval after
   * its heartbeat is ignored: the coordinator relies on that bound to know how long an agent's accepted lease
   * lasts at least (it cannot trust a heartbeat's own word, which may have waited in a buffer). A reply that
   * asks for more than the renewal bounds allow (a longer lease or grace, a report interval outside bounds) is
   * refused: no renewal, and the agent keeps its current lease and grace.
   */
  renewed(reply: Renewal, sentAt: number, seq = -1): RenewalOutcome {
    const problem = renewalProblem(reply, this.#bounds);
    if (problem !== undefined) {
      this.refusedRenewals++;
      this.lastRenewalProblem = problem;
      return 'out_of_bounds';
    }
    if (monotonicOf(this.#clock) - sentAt > reply.reportIntervalMs) {
      this.staleRenewals++;
      return 'stale';
    }
    this.#lastRefusal = undefined;
    this.#graceMs = reply.graceMs;
    if (this.#applied < reply.minRevision) {
      this.#heldRenewal = { reply, sentAt, seq };
      return 'accepted';
    }
    this.#accept(reply, sentAt, seq);
    return 'accepted';
  }

  /** Renewals ignored because they came back later than a report interval after their heartbeat. */
  staleRenewals = 0;
  /** Renewals refused as out of bounds, and why the last one was. */
  refusedRenewals = 0;
  lastRenewalProblem: string | undefined;

  /** Sequence number of the heartbeat whose renewal the lease in force comes from (-1 before any). */
  get renewedSeq(): number {
    return this.#renewedSeq;
  }

  /** The coordinator refused to renew; the lease runs out on its own. */
  refused(reason: string): void {
    this.#lastRefusal = reason;
  }

  get lastRefusal(): string | undefined {
    return this.#lastRefusal;
  }

  /** Lease end on this clock's monotonic ms (0 before the first renewal). */
  get leaseUntil(): number {
    return this.#leaseUntil;
  }

  /** Ready to decide: renewed once, or (coordinator unreachable at start) records loaded and serving safely. */
  /** `now`: monotonic ms (`monotonicOf`), as every lease instant. */
  ready(now = monotonicOf(this.#clock)): boolean {
    if (this.#renewed) return true;
    return this.#recordsLoaded && now - this.#startedAt >= this.#startupWaitMs;
  }

  /**
   * The lease mode at `now` (monotonic ms): leases and grace periods are durations, so a wall-clock step (back
   * or forth) neither lengthens nor shortens them.
   */
  mode(now = monotonicOf(this.#clock)): LeaseMode {
    if (!this.#renewed) {
      // Never renewed: served (after the startup wait) as if the lease lapsed at start.
      if (!this.ready(now)) return 'none';
      return now > this.#startedAt + this.#graceMs ? 'settled' : 'lapsed';
    }
    if (now <= this.#leaseUntil) return 'valid';
    return now <= this.#leaseUntil + this.#graceMs ? 'lapsed' : 'settled';
  }

  // ---- decisions --------------------------------------------------------------------------------------------

  shareFor(policy: string, subject: string): RegionalShare | undefined {
    const entry = this.#records.get(policy);
    if (entry === undefined) return undefined;
    const override = ownValue(entry.record.overrides, subject);
    return override === undefined
      ? this.#unitShare(entry.record, entry.record.default, policy)
      : this.#unitShare(entry.record, override, unitKey(policy, subject));
  }

  /** The share of `policy`'s default vector, whatever subjects have overrides (no subject is looked up). */
  defaultShare(policy: string): RegionalShare | undefined {
    const entry = this.#records.get(policy);
    return entry === undefined ? undefined : this.#unitShare(entry.record, entry.record.default, policy);
  }

  /**
   * How long the default unit's share of `policy` in force now cannot shrink without a new record, as far as a
   * term may count on it, ms (monotonic, as the lease): while the lease is valid, until it ends (then
   * min(issued, safe)); otherwise 0. A lapsed or settled agent gives no terms: a renewal brings the issued share in
   * force at any moment, and a record applied meanwhile may have set it below what the agent holds now (the
   * coordinator settles a lapsed region's shrinks without its acknowledgement and stops counting its safe share
   * one heartbeat after the renewal). Decisions that started lapsed or settled are short; a term is not, and the
   * coordinator does not see it.
   */
  stableForMs(policy: string, now = monotonicOf(this.#clock)): number {
    if (!this.#records.has(policy) || this.mode(now) !== 'valid') return 0;
    return Math.max(0, this.#leaseUntil - now);
  }

  /** Subjects of `policy` with an override in the record in force (empty without a record). */
  overrideSubjects(policy: string): readonly string[] {
    const record = this.#records.get(policy)?.record;
    return record === undefined ? [] : Object.keys(record.overrides);
  }

  /** The share in force of one unit of `record` (`key`: its history key), or undefined before the first lease. */
  #unitShare(
    record: AllocationRecord,
    unit: AllocationRecord['default'],
    key: string,
  ): RegionalShare | undefined {
    const now = this.#clock.now();
    const mode = this.#observeMode(monotonicOf(this.#clock));
    if (mode === 'none') return undefined;
    const share = inForceShare(
      ownValue(unit.shares, this.region) ?? 0,
      ownValue(record.safe, this.region) ?? 0,
      mode,
    );
    const floor = this.#history.floor(key, share, record.idleTtlSeconds * 1000, now);
    const out: RegionalShare =
      floor === undefined ? { share, epoch: unit.epoch } : { share, epoch: unit.epoch, floor };
    // The lowest share held within the window: this agent's own memory, and the coordinator's (in the record),
    // which an agent that restarted or was just added has no memory of.
    const held = ownValue(unit.lowest, this.region);
    const lowest = Math.min(
      this.#history.lowest(key, share, record.idleTtlSeconds * 1000, now),
      held ?? share,
    );
    if (lowest < share) out.lowest = lowest;
    return out;
  }

  regionShares(policy: string, subject: string): Readonly<Record<string, number>> | undefined {
    const record = this.#records.get(policy)?.record;
    if (record === undefined) return undefined;
    return (ownValue(record.overrides, subject) ?? record.default).shares;
  }

  regionCeilings(policy: string, subject: string): Readonly<Record<string, number>> | undefined {
    const record = this.#records.get(policy)?.record;
    if (record === undefined) return undefined;
    const unit = ownValue(record.overrides, subject) ?? record.default;
    // What each region holds for certain: its issued share, or its old one during a shrink not yet acknowledged.
    const held = new Map<string, number>();
    const atLeast = (m: Map<string, number>, region: string, share: number) =>
      m.set(region, Math.max(m.get(region) ?? 0, share));
    for (const [region, share] of Object.entries(unit.shares)) atLeast(held, region, share);
    for (const [region, share] of Object.entries(unit.pending)) atLeast(held, region, share);
    let heldSum = 0;
    for (const share of held.values()) heldSum += share;
    const out = new Map(held);
    // A region whose lease lapsed longer than the grace ago decides with its safe share, whatever it was issued
    // (in-force.ts), and lends from it. The coordinator counts that region at its safe share only while it may
    // be lapsed, keeping Σ claim ≤ 1 with every other region's claim at least what it holds: so a lapsed region's
    // safe share fits in the room the others leave, and a lender whose lease is valid (which the borrower cannot
    // tell) is never believed above that room (docs/protocol.md, "Claims").
    for (const [region, safe] of Object.entries(record.safe)) {
      const room = 1 - (heldSum - (held.get(region) ?? 0));
      atLeast(out, region, Math.max(0, Math.min(safe, room)));
    }
    return ownRecordOf(out);
  }

  enter(_policy: string): () => void {
    const exit = this.#inFlight.enter(this.#applied, this.mode());
    return () => {
      if (!exit()) return;
      this.#maybeAck();
      this.#emit();
    };
  }

  /** Highest revision such that no decision started under an older record is in flight. */
  get ackRevision(): number {
    const oldest = this.#inFlight.oldest();
    return oldest === undefined ? this.#applied : Math.min(this.#applied, oldest);
  }

  /** Called with the watermark whenever it passes a revision that carries a shrink of this region. */
  onAck(listener: (ackRevision: number) => void): void {
    this.#onAck = listener;
  }

  // ---- observation (tests, simulator) -------------------------------------------------------------------------

  /**
   * Listen to every change of the shares this agent may be deciding with. In-flight decisions started under older
   * records keep the higher of the shares they could be using until they finish.
   */
  onInForce(listener: (change: InForceChange) => void): void {
    if (this.#observer === undefined) this.#observer = new InForceObserver(listener);
    else this.#observer.listener = listener;
    this.#emit();
  }

  /** Re-evaluate lease transitions that happen with the passage of time (expiry, grace) and emit changes. */
  poll(): void {
    this.#observeMode(monotonicOf(this.#clock));
    this.#emit();
  }

  /** Subjects the record of `policy` asks this agent to report every interval (empty when none). */
  watched(policy: string): ReadonlySet<string> {
    const entry = this.#records.get(policy);
    if (entry === undefined || entry.record.watch === undefined) return EMPTY;
    let set = this.#watchCache.get(entry.record);
    if (set === undefined) {
      set = new Set(entry.record.watch);
      this.#watchCache.set(entry.record, set);
    }
    return set;
  }

  /** Policies with a record. */
  policies(): string[] {
    return [...this.#records.keys()];
  }

  // ---- internals ------------------------------------------------------------------------------------------

  #accept(reply: Renewal, sentAt: number, seq: number): void {
    if (sentAt + reply.leaseMs > this.#leaseUntil) {
      this.#leaseUntil = sentAt + reply.leaseMs;
      this.#renewedSeq = seq;
    }
    this.#renewed = true;
    this.#heldRenewal = undefined;
    this.#observeMode(monotonicOf(this.#clock));
    this.#emit();
  }

  #releaseHeldRenewal(): void {
    const held = this.#heldRenewal;
    if (held !== undefined && this.#applied >= held.reply.minRevision)
      this.#accept(held.reply, held.sentAt, held.seq);
  }

  /**
   * Note a lease-mode transition at the instant it happened, in every unit's history. `now` is monotonic; the
   * history keeps wall time (its cut-offs are compared with the store's clock), so the instant is carried over.
   */
  #observeMode(now: number): LeaseMode {
    const mode = this.mode(now);
    if (mode === this.#mode) return mode;
    // The instant of the transition: lease end, grace end, or now (renewal, startup).
    const base = this.#renewed ? this.#leaseUntil : this.#startedAt;
    const monoAt =
      mode === 'lapsed'
        ? Math.min(now, base)
        : mode === 'settled'
          ? Math.min(now, base + this.#graceMs)
          : now;
    const at = this.#clock.now() - (now - monoAt);
    this.#mode = mode;
    if (mode === 'none') return mode;
    for (const [policy, { record }] of this.#records) {
      const safe = ownValue(record.safe, this.region) ?? 0;
      this.#history.push(
        policy,
        inForceShare(ownValue(record.default.shares, this.region) ?? 0, safe, mode),
        at,
        record.idleTtlSeconds,
      );
      for (const [subject, unit] of Object.entries(record.overrides)) {
        this.#history.push(
          unitKey(policy, subject),
          inForceShare(ownValue(unit.shares, this.region) ?? 0, safe, mode),
          at,
          record.idleTtlSeconds,
        );
      }
    }
    return mode;
  }

  #noteIssued(
    policy: string,
    before: AllocationRecord | undefined,
    record: AllocationRecord | null,
    revision: number,
    now: number,
    mono: number,
  ): void {
    const mode = this.mode(mono);
    const units = new Set<string>();
    for (const r of [before, record]) {
      if (r === undefined || r === null) continue;
      units.add('');
      for (const s of Object.keys(r.overrides)) units.add(s);
    }
    for (const subject of units) {
      const key = unitKey(policy, subject);
      // A subject without an override follows the default vector.
      const unit =
        record === null
          ? undefined
          : subject === ''
            ? record.default
            : (ownValue(record.overrides, subject) ?? record.default);
      const issued = ownValue(unit?.shares, this.region) ?? 0;
      if (record !== null) {
        // Before the first lease nothing is decided: no share was in force, so none enters the history.
        if (mode !== 'none') {
          this.#history.push(
            key,
            inForceShare(issued, ownValue(record.safe, this.region) ?? 0, mode),
            now,
            record.idleTtlSeconds,
          );
        }
      } else {
        this.#history.delete(key);
      }
      this.#observer?.issued(key, revision, issued);
    }
    this.#emit();
  }

  #maybeAck(): void {
    if (this.#onAck === undefined) return;
    const ack = this.ackRevision;
    if (ack >= this.#wantAck && this.#wantAck > this.#ackSent) {
      this.#ackSent = ack;
      this.#onAck(ack);
    }
  }

  /** Tell the observer, if any, of every unit whose in-force share changed. */
  #emit(): void {
    const observer = this.#observer;
    if (observer === undefined) return;
    const now = this.#clock.now();
    observer.emit({
      region: this.region,
      records: this.#records,
      mode: this.mode(),
      ackRevision: this.ackRevision,
      inFlight: this.#inFlight,
      now,
    });
  }
}
