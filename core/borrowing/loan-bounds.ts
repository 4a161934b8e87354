/**
 * Bounds on loans that do not trust the other side: what a borrower believes of a grant, and what a lender gives
 * one requesting region. A NATS credential of one agent may answer its region's loan requests with any grant, or
 * send lend requests to any region; these keep both bounded (docs/security.md).
 *
 * - `GrantCheck` (borrower): a lender region can have given, for one subject, at most its share of the burst plus
 *   its share of the refill since (it cannot hold more), and never more than asked. The borrower keeps, per
 *   (lender, policy, subject), a shadow of the most the lender's bucket could hold (full at first sight, refilled
 *   at the lender's share of the rate, debited by every grant believed) and believes a grant up to it. The lender
 *   debited the grant at some instant between the request's send and the answer's arrival and refilled from then
 *   on, so the shadow caps its level at the send and adds the exchange's refill uncapped: a shadow capped at the
 *   arrival would believe a full lender, drained by every loan, a little less than it gave each time (a round
 *   trip's refill), and the difference would be lost. A grant above what was asked, or a spend that is
 *   not the cost, is not a lender's answer at all: nothing is believed.
 * - `LendBudget` (lender): per (requesting region, policy), a token bucket of `subjects` bursts and `subjects`
 *   refill rates of the policy, from which every lend is reserved before it runs; a flood of lend requests takes
 *   at most that from this region's buckets, whatever subjects it names.
 *
 * State is a BoundedLru per side: an evicted shadow starts full again (the bound of one burst still holds per
 * entry), an evicted budget starts full. Pure: the caller gives the time (a monotonic clock's ms).
 */
import { BoundedLru } from '../bounded-lru.js';
import type { LendMode } from '../models/transfer.js';

/** A bucket level as last written: micro-tokens at `at` (ms). */
interface Level {
  micros: number;
  at: number;
}

/** A bucket of `capacityMicros` refilled at `microsPerMs`: its level at `now`, full when never seen. */
function levelAt(level: Level | undefined, capacityMicros: number, microsPerMs: number, now: number): number {
  if (level === undefined) return capacityMicros;
  const gained = Math.max(0, now - level.at) * microsPerMs;
  return Math.min(capacityMicros, level.micros + gained);
}

/** The most a lender region could hold of one subject: its share of the burst and of the refill. */
export interface LenderBound {
  /** The lender's share of the subject's burst, micro-tokens. */
  capacityMicros: number;
  /** The lender's share of the subject's refill, micro-tokens per ms. */
  microsPerMs: number;
}

/** The lender bound of a share `share` of a subject with burst `capacity` and refill `refillPerSecond` (tokens). */
export function lenderBound(capacity: number, refillPerSecond: number, share: number): LenderBound {
  const s = Math.max(0, Math.min(1, share));
  return { capacityMicros: Math.floor(capacity * s * 1e6), microsPerMs: refillPerSecond * s * 1e3 };
}

/** What a borrower makes of a grant: the micro-tokens it believes, and why it believes less. */
export interface GrantVerdict {
  believed: number;
  /** `over_asked`: more than asked (or a spend not of the cost): nothing is believed; `over_bound`: clipped. */
  problem?: 'over_asked' | 'over_bound';
}

export class GrantCheck {
  readonly #shadows: BoundedLru<Level>;

  constructor(maxEntries: number) {
    this.#shadows = new BoundedLru(maxEntries);
  }

  /**
   * Check `granted` micro-tokens of lender `lender` for `subject` of `policy`, asked `asked` in `mode`, against
   * `bound`, arrived at `now` (ms) for a request sent at `sentAt` (ms, ≤ now; `now` when unknown); debits what
   * is believed.
   */
  check(
    lender: string,
    policy: string,
    subject: string,
    ask: { mode: LendMode; asked: number; granted: number },
    bound: LenderBound,
    now: number,
    sentAt: number = now,
  ): GrantVerdict {
    const { mode, asked, granted } = ask;
    if (granted <= 0) return { believed: 0 };
    if (granted > asked || (mode === 'spend' && granted !== asked))
      return { believed: 0, problem: 'over_asked' };
    const key = `${lender}\u0000${policy}\u0000${subject}`;
    // The most it could hold when it debited, at any instant from the send to now: capped as a bucket is up to
    // the send, then refilled through the exchange (the cap never bit on what it refilled after its debit). From
    // the last grant's arrival at the earliest, so no stretch of time is counted twice.
    const previous = this.#shadows.get(key);
    const from = Math.max(Math.min(sentAt, now), previous?.at ?? -Infinity);
    const uncapped =
      levelAt(previous, bound.capacityMicros, bound.microsPerMs, from) + (now - from) * bound.microsPerMs;
    const level = Math.min(bound.capacityMicros, uncapped);
    // A spend is the cost or nothing: the lender cannot have charged part of it.
    const believed =
      mode === 'spend' ? (granted <= level ? granted : 0) : Math.min(granted, Math.floor(level));
    // What it may hold now: whatever instant it debited at, the refill it had after the debit is the exchange's.
    this.#shadows.set(key, { micros: Math.min(bound.capacityMicros, uncapped - believed), at: now });
    return believed < granted ? { believed, problem: 'over_bound' } : { believed };
  }

  /** Entries held (≤ maxEntries). */
  get size(): number {
    return this.#shadows.size;
  }
}

/** Default of `LendBudget`'s size: a requesting region may take 16 subjects' bursts, and 16 refills sustained. */
export const DEFAULT_LEND_BUDGET_SUBJECTS = 16;

export class LendBudget {
  readonly #budgets: BoundedLru<Level>;
  readonly subjects: number;

  constructor(subjects: number, maxEntries: number) {
    if (!(Number.isFinite(subjects) && subjects > 0)) throw new RangeError('subjects must be > 0');
    this.subjects = subjects;
    this.#budgets = new BoundedLru(maxEntries);
  }

  #bucket(policy: { capacity: number; refillPerSecond: number }): LenderBound {
    return lenderBound(policy.capacity * this.subjects, policy.refillPerSecond * this.subjects, 1);
  }

  /**
   * Reserve up to `amount` micro-tokens for a lend to region `from` under `policy` (named `key`: the policy and
   * class) at `now` (ms): returns what may be lent (0: the budget is spent; for a spend, the whole amount or 0).
   * Call `settle` with what was reserved and what the lend gave.
   */
  reserve(
    from: string,
    key: string,
    policy: { capacity: number; refillPerSecond: number },
    amount: number,
    mode: LendMode,
    now: number,
  ): number {
    const id = `${from}\u0000${key}`;
    const b = this.#bucket(policy);
    const level = levelAt(this.#budgets.get(id), b.capacityMicros, b.microsPerMs, now);
    const room = Math.floor(level);
    const reserved = mode === 'spend' ? (amount <= room ? amount : 0) : Math.min(amount, room);
    this.#budgets.set(id, { micros: level - reserved, at: now });
    return reserved;
  }

  /** Give back what a lend reserved and did not give. */
  settle(from: string, key: string, reserved: number, given: number): void {
    const back = reserved - Math.max(0, Math.min(given, reserved));
    if (back <= 0) return;
    const id = `${from}\u0000${key}`;
    const level = this.#budgets.get(id);
    // Evicted meanwhile: it starts full again, nothing to give back.
    if (level === undefined) return;
    this.#budgets.set(id, { micros: level.micros + back, at: level.at });
  }

  get size(): number {
    return this.#budgets.size;
  }
}
