/**
 * The shares an agent may be deciding with: the share its lease mode puts in force, its decisions in flight by
 * the record revision and lease mode they started under (what its acknowledgements wait for), and, for invariant
 * checkers in tests and the simulator, every change of the share in force of each unit, in-flight decisions of
 * older records included.
 */
import { ownValue } from '../own-keys.js';
import type { AllocationRecord } from '../wire/protocol.js';
import { overridePrefix, splitUnitKey, unitKey } from './share-history.js';

/** Lease state: not deciding yet, issued shares, min(issued, safe), or safe shares. */
export type LeaseMode = 'none' | 'valid' | 'lapsed' | 'settled';

/** The share in force of a unit issued `issued` with safe share `safe`, in lease mode `mode`. */
export function inForceShare(issued: number, safe: number, mode: LeaseMode): number {
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

/** A unit's issued share from the record at `revision` on. */
export interface IssuedShare {
  revision: number;
  share: number;
}

/** Decisions in flight by the revision they started under (insertion order = increasing revision). */
export class InFlightDecisions {
  readonly #count = new Map<number, number>();
  /** Of those, how many started with a valid lease and how many settled (the rest started lapsed). */
  readonly #modes = new Map<number, { valid: number; settled: number }>();

  /**
   * A decision starts under `revision` in lease mode `mode`. The function ends it (once; later calls do nothing)
   * and answers whether it was the last one in flight of its revision.
   */
  enter(revision: number, mode: LeaseMode): () => boolean {
    let modes = this.#modes.get(revision);
    if (modes === undefined) this.#modes.set(revision, (modes = { valid: 0, settled: 0 }));
    if (mode === 'valid') modes.valid++;
    else if (mode === 'settled') modes.settled++;
    this.#count.set(revision, (this.#count.get(revision) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return false;
      done = true;
      if (mode === 'valid') modes.valid--;
      else if (mode === 'settled') modes.settled--;
      const left = (this.#count.get(revision) ?? 1) - 1;
      if (left > 0) {
        this.#count.set(revision, left);
        return false;
      }
      this.#count.delete(revision);
      this.#modes.delete(revision);
      return true;
    };
  }

  /** The oldest revision a decision in flight started under; undefined when none is in flight. */
  oldest(): number | undefined {
    const oldest = this.#count.keys().next();
    return oldest.done ? undefined : oldest.value;
  }

  /**
   * Largest share a decision still in flight may be using from `entry`, the unit's issued share from its revision
   * until `until`: the issued share for one that started with a valid lease, min(issued, safe) for one that
   * started lapsed, the safe share for one that started settled; 0 if none is in flight.
   */
  bound(entry: IssuedShare, until: number, safe: number): number {
    let bound = 0;
    for (const [revision, n] of this.#count) {
      if (revision < entry.revision || revision >= until) continue;
      const modes = this.#modes.get(revision)!;
      if (modes.valid > 0) bound = Math.max(bound, entry.share);
      if (modes.settled > 0) bound = Math.max(bound, safe);
      if (n > modes.valid + modes.settled) bound = Math.max(bound, Math.min(entry.share, safe));
    }
    return bound;
  }
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

/** What the observer reads of the agent's lease at one instant. */
export interface LeaseState {
  region: string;
  records: ReadonlyMap<string, { record: AllocationRecord }>;
  mode: LeaseMode;
  /** The acknowledgement watermark: no decision of an older revision is in flight. */
  ackRevision: number;
  inFlight: InFlightDecisions;
  now: number;
}

/** Tells a listener every change of the share in force of each unit. */
export class InForceObserver {
  /** Who is told. */
  listener: (change: InForceChange) => void;
  /** Issued shares per unit by revision, while decisions of older revisions are in flight. */
  readonly #issuedSince = new Map<string, IssuedShare[]>();
  readonly #last = new Map<string, number>();

  constructor(listener: (change: InForceChange) => void) {
    this.listener = listener;
  }

  /** The record at `revision` issues `share` to the unit `key`. */
  issued(key: string, revision: number, share: number): void {
    let list = this.#issuedSince.get(key);
    if (list === undefined) this.#issuedSince.set(key, (list = []));
    list.push({ revision, share });
  }

  /** Emit the in-force share of every unit that changed since the last emission. */
  emit(state: LeaseState): void {
    const { region, records, mode, now } = state;
    const oldest = state.ackRevision;
    for (const [key, list] of this.#issuedSince) {
      // Keep the entry at or before the oldest in-flight revision: in-flight decisions may use it.
      let start = 0;
      for (let i = 0; i < list.length; i++) if (list[i]!.revision <= oldest) start = i;
      if (start > 0) list.splice(0, start);
      if (list.length === 1 && !records.has(splitUnitKey(key)[0])) this.#issuedSince.delete(key);
    }
    const current = new Map<string, number>();
    for (const [policy, { record }] of records) {
      const safe = ownValue(record.safe, region) ?? 0;
      const subjects = new Set(['', ...Object.keys(record.overrides)]);
      const prefix = overridePrefix(policy);
      for (const key of this.#issuedSince.keys()) {
        if (key.startsWith(prefix) && (this.#issuedSince.get(key)?.length ?? 0) > 1) {
          subjects.add(key.slice(prefix.length));
        }
      }
      for (const subject of subjects) {
        const key = unitKey(policy, subject);
        const unit =
          subject === '' ? record.default : (ownValue(record.overrides, subject) ?? record.default);
        let share = inForceShare(ownValue(unit.shares, region) ?? 0, safe, mode);
        // In-flight decisions of older records count at what they may be deciding with: the issued share they
        // started under if they started with a valid lease, at most the safe share otherwise. The last entry is
        // the current record, already counted above.
        const since = this.#issuedSince.get(key) ?? [];
        if (mode !== 'none') {
          for (let i = 0; i < since.length - 1; i++)
            share = Math.max(share, state.inFlight.bound(since[i]!, since[i + 1]!.revision, safe));
        }
        current.set(key, share);
      }
    }
    for (const [key, share] of current) {
      if (this.#last.get(key) === share) continue;
      this.#last.set(key, share);
      const [policy, subject] = splitUnitKey(key);
      this.listener({ policy, subject, share, at: now });
    }
    for (const key of [...this.#last.keys()]) {
      if (current.has(key)) continue;
      this.#last.delete(key);
      const [policy, subject] = splitUnitKey(key);
      this.listener({ policy, subject, share: 0, at: now, removed: true });
    }
  }
}
