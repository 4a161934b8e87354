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
import type { Clock } from '../clock.js';
import type { RegionalShare, ShareView } from '../shares.js';
import type { AllocationRecord, Renewal } from '../wire/protocol.js';

export interface AgentLeaseOptions {
  region: string;
  clock: Clock;
  /** Margin added to floor cut-offs for the offset between this clock and Redis time, ms. */
  skewMs: number;
  /**
   * With records loaded but no renewal after this long since start (coordinator unreachable), the agent serves
   * in lapsed mode: min(issued, safe), then safe after the grace period. Default 3000 ms.
   */
  startupWaitMs?: number;
  /** Grace period to assume before the first renewal says otherwise, ms. Default 12000. */
  graceMs?: number;
}

/** In-force share change, for invariant checkers in tests and the simulator. */
export interface InForceChange {
  policy: string;
  /** The subject of an override; undefined for the policy's default vector. */
  subject: string | undefined;
  /** Share this agent may be deciding with right now (in-flight decisions of older records included). */
  share: number;
  at: number;
  /** The override is gone: the subject follows the policy's default vector again (or the policy is gone). */
  removed?: true;
}

/** Lease state: not deciding yet, issued shares, min(issued, safe), or safe shares. */
export type LeaseMode = 'none' | 'valid' | 'lapsed' | 'settled';

interface History {
  /** (time, in-force share) points, oldest first, pruned to the policy's idle TTL. */
  points: { at: number; share: number }[];
}

const SEP = '\u0000';
const EMPTY: ReadonlySet<string> = new Set();

export class AgentLease implements ShareView {
  readonly region: string;
  readonly #clock: Clock;
  readonly #skewMs: number;
  readonly #startedAt: number;
  readonly #startupWaitMs: number;
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

  /** Decisions in flight by the revision they started under (insertion order = increasing revision). */
  readonly #inFlight = new Map<number, number>();
  /** Of those, how many started with a valid lease and how many settled (the rest started lapsed). */
  readonly #inFlightModes = new Map<number, { valid: number; settled: number }>();
  /** Highest revision with a pending shrink of this region: acknowledge it as soon as possible. */
  #wantAck = 0;
  #ackSent = 0;
  #onAck: ((ackRevision: number) => void) | undefined;

  /** Share history per unit, for refill floors. */
  readonly #history = new Map<string, History>();
  /** Issued shares per unit by revision, while decisions of older revisions are in flight (for the checker). */
  readonly #issuedSince = new Map<string, { revision: number; share: number }[]>();
  #onInForce: ((change: InForceChange) => void) | undefined;
  readonly #lastInForce = new Map<string, number>();
  #mode: LeaseMode = 'none';
  readonly #watchCache = new WeakMap<AllocationRecord, ReadonlySet<string>>();

  constructor(options: AgentLeaseOptions) {
    this.region = options.region;
    this.#clock = options.clock;
    this.#skewMs = options.skewMs;
    this.#startedAt = options.clock.now();
    this.#startupWaitMs = options.startupWaitMs ?? 3000;
    this.#graceMs = options.graceMs ?? 12_000;
  }

  // ---- records ----------------------------------------------------------------------------------------------

  /** A KV entry: the record of `policy` at `revision`, or its deletion (null). Entries arrive in revision order. */
  applyRecord(policy: string, record: AllocationRecord | null, revision: number): void {
    const known = this.#records.get(policy);
    if (known !== undefined && revision <= known.revision) return; // stale or duplicate
    const now = this.#clock.now();
    const before = this.#records.get(policy)?.record;
    if (record === null) this.#records.delete(policy);
    else this.#records.set(policy, { record, revision });
    this.#applied = Math.max(this.#applied, revision);
    if (record !== null && record.default.pending[this.region] !== undefined)
      this.#wantAck = Math.max(this.#wantAck, revision);
    for (const subject of Object.keys(record?.overrides ?? {})) {
      if (record!.overrides[subject]!.pending[this.region] !== undefined)
        this.#wantAck = Math.max(this.#wantAck, revision);
    }
    this.#noteIssued(policy, before, record, revision, now);
    this.#releaseHeldRenewal();
    this.#maybeAck();
  }

  /** The initial snapshot of the records has been delivered. */
  recordsLoaded(): void {
    this.#recordsLoaded = true;
  }

  get appliedRevision(): number {
    return this.#applied;
  }

  // ---- lease ----------------------------------------------------------------------------------------------

  /**
   * A renewal for heartbeat `seq`, sent at `sentAt` (this clock). A reply later than one report interval after
   * its heartbeat is ignored: the coordinator relies on that bound to know how long an agent's accepted lease
   * lasts at least (it cannot trust a heartbeat's own word, which may have waited in a buffer).
   * Returns false for such a stale reply.
   */
  renewed(reply: Renewal, sentAt: number, seq = -1): boolean {
    if (this.#clock.now() - sentAt > reply.reportIntervalMs) {
      this.staleRenewals++;
      return false;
    }
    this.#lastRefusal = undefined;
    this.#graceMs = reply.graceMs;
    if (this.#applied < reply.minRevision) {
      this.#heldRenewal = { reply, sentAt, seq };
      return true;
    }
    this.#accept(reply, sentAt, seq);
    return true;
  }

  /** Renewals ignored because they came back later than a report interval after their heartbeat. */
  staleRenewals = 0;

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

  /** Lease end on this clock (0 before the first renewal). */
  get leaseUntil(): number {
    return this.#leaseUntil;
  }

  /** Ready to decide: renewed once, or (coordinator unreachable at start) records loaded and serving safely. */
  ready(now = this.#clock.now()): boolean {
    if (this.#renewed) return true;
    return this.#recordsLoaded && now - this.#startedAt >= this.#startupWaitMs;
  }

  mode(now = this.#clock.now()): LeaseMode {
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
    const now = this.#clock.now();
    const mode = this.#observeMode(now);
    if (mode === 'none') return undefined;
    const { record } = entry;
    const override = record.overrides[subject];
    const unit = override ?? record.default;
    const share = this.#inForce(unit.shares[this.region] ?? 0, record.safe[this.region] ?? 0, mode);
    const key = override === undefined ? policy : policy + SEP + subject;
    const floor = this.#floor(key, share, record.idleTtlSeconds * 1000, now);
    return floor === undefined ? { share, epoch: unit.epoch } : { share, epoch: unit.epoch, floor };
  }

  enter(_policy: string): () => void {
    const revision = this.#applied;
    const mode = this.mode();
    let modes = this.#inFlightModes.get(revision);
    if (modes === undefined) this.#inFlightModes.set(revision, (modes = { valid: 0, settled: 0 }));
    if (mode === 'valid') modes.valid++;
    else if (mode === 'settled') modes.settled++;
    this.#inFlight.set(revision, (this.#inFlight.get(revision) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (mode === 'valid') modes.valid--;
      else if (mode === 'settled') modes.settled--;
      const left = (this.#inFlight.get(revision) ?? 1) - 1;
      if (left > 0) {
        this.#inFlight.set(revision, left);
        return;
      }
      this.#inFlight.delete(revision);
      this.#inFlightModes.delete(revision);
      this.#maybeAck();
      if (this.#onInForce !== undefined) this.#emitAll();
    };
  }

  /** Highest revision such that no decision started under an older record is in flight. */
  get ackRevision(): number {
    const oldest = this.#inFlight.keys().next();
    return oldest.done ? this.#applied : Math.min(this.#applied, oldest.value);
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
    this.#onInForce = listener;
    this.#emitAll();
  }

  /** Re-evaluate lease transitions that happen with the passage of time (expiry, grace) and emit changes. */
  poll(): void {
    this.#observeMode(this.#clock.now());
    if (this.#onInForce !== undefined) this.#emitAll();
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
    this.#observeMode(this.#clock.now());
    if (this.#onInForce !== undefined) this.#emitAll();
  }

  #releaseHeldRenewal(): void {
    const held = this.#heldRenewal;
    if (held !== undefined && this.#applied >= held.reply.minRevision)
      this.#accept(held.reply, held.sentAt, held.seq);
  }

  #inForce(issued: number, safe: number, mode: LeaseMode): number {
    switch (mode) {
      case 'valid':
        return issued;
      case 'lapsed':
        return Math.min(issued, safe);
      case 'settled':
        return safe;
      case 'none':
        return 0;
    }
  }

  /** Note a lease-mode transition at the instant it happened, in every unit's history. */
  #observeMode(now: number): LeaseMode {
    const mode = this.mode(now);
    if (mode === this.#mode) return mode;
    // The instant of the transition: lease end, grace end, or now (renewal, startup).
    const base = this.#renewed ? this.#leaseUntil : this.#startedAt;
    const at =
      mode === 'lapsed'
        ? Math.min(now, base)
        : mode === 'settled'
          ? Math.min(now, base + this.#graceMs)
          : now;
    this.#mode = mode;
    if (mode === 'none') return mode;
    for (const [policy, { record }] of this.#records) {
      const safe = record.safe[this.region] ?? 0;
      this.#push(
        policy,
        this.#inForce(record.default.shares[this.region] ?? 0, safe, mode),
        at,
        record.idleTtlSeconds,
      );
      for (const [subject, unit] of Object.entries(record.overrides)) {
        this.#push(
          policy + SEP + subject,
          this.#inForce(unit.shares[this.region] ?? 0, safe, mode),
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
  ): void {
    const mode = this.mode(now);
    const units = new Set<string>();
    for (const r of [before, record]) {
      if (r === undefined || r === null) continue;
      units.add('');
      for (const s of Object.keys(r.overrides)) units.add(s);
    }
    for (const subject of units) {
      const key = subject === '' ? policy : policy + SEP + subject;
      // A subject without an override follows the default vector.
      const unit =
        record === null
          ? undefined
          : subject === ''
            ? record.default
            : (record.overrides[subject] ?? record.default);
      const issued = unit?.shares[this.region] ?? 0;
      if (record !== null) {
        // Before the first lease nothing is decided: no share was in force, so none enters the history.
        if (mode !== 'none') {
          this.#push(
            key,
            this.#inForce(issued, record.safe[this.region] ?? 0, mode),
            now,
            record.idleTtlSeconds,
          );
        }
      } else {
        this.#history.delete(key);
      }
      if (this.#onInForce !== undefined) {
        let list = this.#issuedSince.get(key);
        if (list === undefined) this.#issuedSince.set(key, (list = []));
        list.push({ revision, share: issued });
      }
    }
    if (this.#onInForce !== undefined) this.#emitAll();
  }

  #push(key: string, share: number, at: number, idleTtlSeconds: number): void {
    const h = this.#history.get(key);
    if (h === undefined) {
      this.#history.set(key, { points: [{ at, share }] });
      return;
    }
    const last = h.points[h.points.length - 1];
    if (last !== undefined && last.share === share) return;
    h.points.push({ at, share });
    // Keep one point older than the window: the share in force at its start.
    const horizon = at - idleTtlSeconds * 1000 - this.#skewMs;
    while (h.points.length > 2 && h.points[1]!.at <= horizon) h.points.shift();
  }

  /**
   * The refill floor for buckets of one unit. Only a bucket last written before the latest *decrease* of the
   * share can have an idle interval in which the share dipped below the rate stored with it: after that
   * decrease the share only rose, and the script already refills at most at the stored rate. Such a bucket
   * refills at most at the lowest share in force within the idle TTL. A decrease older than the idle TTL
   * needs no floor: every bucket written before it has expired.
   */
  #floor(key: string, share: number, windowMs: number, now: number): RegionalShare['floor'] {
    const h = this.#history.get(key);
    if (h === undefined || h.points.length < 2) return undefined;
    const horizon = now - windowMs - this.#skewMs;
    let lastDecrease: number | undefined;
    for (let i = h.points.length - 1; i > 0; i--) {
      if (h.points[i]!.share < h.points[i - 1]!.share) {
        lastDecrease = h.points[i]!.at;
        break;
      }
    }
    if (lastDecrease === undefined || lastDecrease <= horizon) return undefined;
    let lowest = share;
    for (let i = 0; i < h.points.length; i++) {
      const next = h.points[i + 1];
      if (next !== undefined && next.at <= horizon) continue; // wholly before the window
      lowest = Math.min(lowest, h.points[i]!.share);
    }
    if (lowest >= share) return undefined;
    return { sinceMs: lastDecrease + this.#skewMs, share: lowest };
  }

  /**
   * Largest share a decision still in flight may be using from `entry`, the unit's issued share from its revision
   * until `until`: the issued share for one that started with a valid lease, min(issued, safe) for one that
   * started lapsed, the safe share for one that started settled; 0 if none is in flight.
   */
  #olderBound(entry: { revision: number; share: number }, until: number, safe: number): number {
    let bound = 0;
    for (const [revision, n] of this.#inFlight) {
      if (revision < entry.revision || revision >= until) continue;
      const modes = this.#inFlightModes.get(revision)!;
      if (modes.valid > 0) bound = Math.max(bound, entry.share);
      if (modes.settled > 0) bound = Math.max(bound, safe);
      if (n > modes.valid + modes.settled) bound = Math.max(bound, Math.min(entry.share, safe));
    }
    return bound;
  }

  #maybeAck(): void {
    if (this.#onAck === undefined) return;
    const ack = this.ackRevision;
    if (ack >= this.#wantAck && this.#wantAck > this.#ackSent) {
      this.#ackSent = ack;
      this.#onAck(ack);
    }
  }

  /** Emit the in-force share of every unit that changed since the last emission. */
  #emitAll(): void {
    const listener = this.#onInForce;
    if (listener === undefined) return;
    const now = this.#clock.now();
    const mode = this.mode(now);
    const oldest = this.ackRevision;
    for (const [key, list] of this.#issuedSince) {
      // Keep the entry at or before the oldest in-flight revision: in-flight decisions may use it.
      let start = 0;
      for (let i = 0; i < list.length; i++) if (list[i]!.revision <= oldest) start = i;
      if (start > 0) list.splice(0, start);
      if (list.length === 1 && !this.#records.has(key.split(SEP)[0]!)) this.#issuedSince.delete(key);
    }
    const current = new Map<string, number>();
    for (const [policy, { record }] of this.#records) {
      const safe = record.safe[this.region] ?? 0;
      const subjects = new Set(['', ...Object.keys(record.overrides)]);
      for (const key of this.#issuedSince.keys()) {
        if (key.startsWith(policy + SEP) && (this.#issuedSince.get(key)?.length ?? 0) > 1) {
          subjects.add(key.slice(policy.length + 1));
        }
      }
      for (const subject of subjects) {
        const key = subject === '' ? policy : policy + SEP + subject;
        const unit = subject === '' ? record.default : (record.overrides[subject] ?? record.default);
        let share = this.#inForce(unit.shares[this.region] ?? 0, safe, mode);
        // In-flight decisions of older records count at what they may be deciding with: the issued share they
        // started under if they started with a valid lease, at most the safe share otherwise. The last entry is
        // the current record, already counted above.
        const since = this.#issuedSince.get(key) ?? [];
        if (mode !== 'none') {
          for (let i = 0; i < since.length - 1; i++)
            share = Math.max(share, this.#olderBound(since[i]!, since[i + 1]!.revision, safe));
        }
        current.set(key, share);
      }
    }
    for (const [key, share] of current) {
      if (this.#lastInForce.get(key) === share) continue;
      this.#lastInForce.set(key, share);
      const [policy, subject] = key.split(SEP) as [string, string | undefined];
      listener({ policy, subject, share, at: now });
    }
    for (const key of [...this.#lastInForce.keys()]) {
      if (current.has(key)) continue;
      this.#lastInForce.delete(key);
      const [policy, subject] = key.split(SEP) as [string, string | undefined];
      listener({ policy, subject, share: 0, at: now, removed: true });
    }
  }
}
