/**
 * The borrow planner, pure: which regions to ask for a subject's tokens, in what order and how much, and what
 * their answers taught. No I/O and no clock of its own (callers pass `now`, epoch ms), so the agent and the
 * simulator run the same rules.
 *
 * Order: largest expected stock first; a fill asks each lender for a part of the room in proportion to what it is
 * expected to hold. A lender never heard of is expected full (a missing bucket is full); one
 * heard of is expected to hold what it said it had left plus its refill since (share × rate × time), capped at its
 * share of the burst. A lender that gave less than asked is dry until its refill could cover the need; a region
 * that did not answer is backed off for every subject. Memory is an LRU of at most `maxEntries`
 * (policy, subject, lender) entries; settings above their limits are refused, never capped.
 */
import { z } from 'zod';
import { microDown } from '../wire/bucket.js';
import { MICRO } from '../models/token-bucket.js';
import type { LoanGrant } from '../wire/loan.js';
import { SPARE_RESERVE, type LendMode } from '../models/transfer.js';

/** Most lenders one borrow round may ask. */
export const MAX_LENDERS_LIMIT = 16;
/** Most dry-memory entries a planner may be configured with. */
export const MAX_DRY_MEMORY_LIMIT = 1_000_000;
/** Longest a lender is remembered dry (when it says it will never refill, e.g. it holds no share). */
export const MAX_DRY_MS = 60_000;

export const BorrowPlannerSettings = z.strictObject({
  /** Most lenders asked in one round, 1..16. */
  maxLenders: z.number().int().min(1).max(MAX_LENDERS_LIMIT),
  /** Most (policy, subject, lender) entries remembered, 1..1,000,000. */
  maxEntries: z.number().int().min(1).max(MAX_DRY_MEMORY_LIMIT),
  /** How long a region that did not answer is skipped, for every subject, ms. */
  unreachableBackoffMs: z.number().int().min(0).max(600_000),
});
export type BorrowPlannerSettings = z.infer<typeof BorrowPlannerSettings>;

/** The planner's defaults, as an agent runs it (and the simulator, which plays agents). */
export const DEFAULT_BORROW_PLANNER: Readonly<BorrowPlannerSettings> = Object.freeze({
  maxLenders: 4,
  maxEntries: 100_000,
  unreachableBackoffMs: 2000,
});

/** What a borrower lacks, for one subject of one policy. */
export interface BorrowNeed {
  policy: string;
  subject: string;
  /** The subject's class (docs/subject-classes.md): lenders size its bucket by the class's limits. */
  subjectClass?: string | undefined;
  /** The subject's global burst and refill (its class's when it has one), tokens and tokens/s. */
  capacity: number;
  refillPerSecond: number;
  /** The borrowing region. */
  borrower: string;
  /**
   * Shares by region (issued or in force) for this subject; a region absent or at 0 holds nothing. Only an
   * estimate for ordering: each lender sizes its own bucket from its own share.
   */
  shares: Readonly<Record<string, number>>;
  /** `fill` the borrower's bucket, or have a lender `spend` the cost (the borrower's bucket can never hold it). */
  mode: LendMode;
  /** Micro-tokens the pending checks still lack (fill) or the cost (spend); ≥ 1. */
  needMicros: number;
  /** Micro-tokens to ask in all: the borrower's room (fill, ≥ need) or the cost (spend). */
  wantMicros: number;
}

/** One loan request to send. */
export interface LoanAsk {
  lender: string;
  mode: LendMode;
  amountMicros: number;
  /** What the planner expects the lender to hold, micro-tokens. */
  expectedMicros: number;
}

/** A round of asks. */
export interface BorrowPlan {
  asks: LoanAsk[];
  /**
   * Regions that may hold tokens but are not asked this round (backed off as unreachable, or beyond
   * `maxLenders`). Empty with no asks: every other region is known dry or holds no share — the subject has used
   * its global budget.
   */
  held: string[];
  /** Regions known dry for this subject now. */
  dry: string[];
}

/**
 * How a lender answered, as the planner learns from it. `rttMs`, when given, is how long the answer took: the
 * planner keeps a smoothed round trip per region, to skip a lender whose answer cannot come back in time and to
 * tell a dead region from a borrower that did not wait long enough.
 */
export type LoanAnswer =
  | { kind: 'grant'; grant: LoanGrant; rttMs?: number | undefined }
  /** The lender has nothing for this subject (no share, another policy version, …): dry for a while. */
  | { kind: 'refused'; rttMs?: number | undefined }
  /** No responders, a failure or a busy lender: the region is backed off. */
  | { kind: 'unreachable' }
  /**
   * No answer within `waitedMs`: the region is backed off only when that wait was long enough to expect an
   * answer (twice its round trip, or TIMEOUT_EVIDENCE_MS when its round trip is not known yet); a wait cut short
   * by the borrower's own deadline proves nothing.
   */
  | { kind: 'timeout'; waitedMs: number }
  /** The wait ended before the request could be sent, or the lender took it up too late: nothing learnt. */
  | { kind: 'late' };

/**
 * A lender that gave less than it was asked is asked again for the same subject no sooner than this, ms, and
 * only once it is expected to hold the need: a subject over its budget in every region then costs at most two
 * loans per lender per second, whatever the policy's rate, instead of one per token refilled. Half a second,
 * not more: after demand moves to another region, the new region's first loans find the old one drained, and a
 * longer pause showed as a dip below the ideal bucket in the simulator's step-shift.
 */
export const MIN_ASK_INTERVAL_MS = 500;

/** A wait for an answer that proves a region with an unknown round trip unreachable when it ends empty, ms. */
export const TIMEOUT_EVIDENCE_MS = 100;
/** Weight of the newest round trip in a region's smoothed round trip. */
const RTT_WEIGHT = 0.2;

interface Entry {
  /** Micro-tokens the lender said it had left, at `at`. */
  remaining: number;
  at: number;
  /** It gave less than it was asked, in this mode (a short `spare` says nothing of what a `fill` would get). */
  short: boolean;
  mode: LendMode;
  /** When, by its own account, it could give `fullAmount` again (epoch ms; 0 when it did not say). */
  fullAt: number;
  fullAmount: number;
  /** Epoch ms before which the lender is known dry; 0 when not dry. */
  dryUntil: number;
}

const SEP = '\u0000';

export class BorrowPlanner {
  readonly settings: Readonly<BorrowPlannerSettings>;
  /** Insertion order is recency: the first entry is the least recently used. */
  readonly #entries = new Map<string, Entry>();
  readonly #backoff = new Map<string, number>();
  /** Smoothed round trip of a loan, by lender region, ms. */
  readonly #rtt = new Map<string, number>();
  readonly #flights = new Map<string, { kind: string; promise: Promise<unknown> }>();

  /** Throws a ZodError listing every setting out of its range. */
  constructor(settings: BorrowPlannerSettings) {
    this.settings = Object.freeze(BorrowPlannerSettings.parse(settings));
  }

  /** Entries remembered now (≤ maxEntries). */
  get size(): number {
    return this.#entries.size;
  }

  /** Borrows in flight now (one per policy and subject at most). */
  get inFlight(): number {
    return this.#flights.size;
  }

  /** The smoothed round trip of a loan from `lender`, ms; undefined until one was measured. */
  roundTripMs(lender: string): number | undefined {
    return this.#rtt.get(lender);
  }

  /**
   * The asks of the next round for `need` at `now` (epoch ms). With `until` (epoch ms, when the borrower stops
   * waiting), a lender whose round trip is longer than the time left is not asked (it is held).
   */
  plan(need: BorrowNeed, now: number, until = Infinity): BorrowPlan {
    const candidates: { lender: string; expected: number }[] = [];
    const held: string[] = [];
    const dry: string[] = [];
    for (const [lender, share] of Object.entries(need.shares).sort(([a], [b]) =>
      a < b ? -1 : a > b ? 1 : 0,
    )) {
      if (lender === need.borrower || !(share > 0)) continue;
      const entry = this.#peek(need, lender);
      if (entry !== undefined && entry.dryUntil > now) {
        dry.push(lender);
        continue;
      }
      if ((this.#backoff.get(lender) ?? 0) > now || (this.#rtt.get(lender) ?? 0) > until - now) {
        held.push(lender);
        continue;
      }
      // The lender's bucket as a decision encodes it (core/wire/bucket.ts), to the micro-token.
      const cap = microDown(need.capacity * share);
      const perMs = (need.refillPerSecond * share * MICRO) / 1000;
      let stock =
        entry === undefined ? cap : Math.min(cap, entry.remaining + perMs * Math.max(0, now - entry.at));
      // What the lender said of its own refill beats the estimate from the shares.
      if (entry !== undefined && entry.fullAt > 0 && now >= entry.fullAt)
        stock = Math.max(stock, entry.fullAmount);
      // A top-up (`spare`) gets only what a lender holds above its reserve.
      const expected = need.mode === 'spare' ? Math.max(0, stock - cap * SPARE_RESERVE) : stock;
      // It can never hold the cost (spend: one lender must hold it all), holds nothing we know of, or gave less
      // than asked a moment ago (asked again half a second later at the soonest). Whether the lenders together can
      // cover the need is judged below, so crumbs left in several regions still add up to a token.
      if (
        (need.mode === 'spend' && (cap < need.needMicros || expected < need.needMicros)) ||
        ((entry !== undefined || need.mode === 'spare') && expected < 1) ||
        (entry !== undefined &&
          entry.short &&
          (entry.mode !== 'spare' || need.mode === 'spare') &&
          now - entry.at < MIN_ASK_INTERVAL_MS)
      ) {
        dry.push(lender);
        continue;
      }
      candidates.push({ lender, expected: Math.floor(expected) });
    }
    // Lenders heard from (or only their spare, for a top-up) together not expected to cover the need: dry alike.
    const known = (lender: string) => need.mode === 'spare' || this.#peekQuiet(need, lender) !== undefined;
    const together = candidates.reduce((sum, c) => sum + c.expected, 0);
    if (need.mode !== 'spend' && together < need.needMicros && candidates.every((c) => known(c.lender))) {
      for (const c of candidates.splice(0)) dry.push(c.lender);
    }
    candidates.sort((a, b) => b.expected - a.expected || (a.lender < b.lender ? -1 : 1));
    const chosen = candidates.slice(0, need.mode === 'spend' ? 1 : this.settings.maxLenders);
    for (const c of candidates.slice(chosen.length)) held.push(c.lender);
    const asks: LoanAsk[] = [];
    if (need.mode === 'spend') {
      for (const c of chosen)
        asks.push({
          lender: c.lender,
          mode: 'spend',
          amountMicros: need.needMicros,
          expectedMicros: c.expected,
        });
    } else {
      // Split the room in proportion to what each lender is expected to hold, so every lender is drained alike
      // and none sits at its cap, where its refill would be wasted; the asks sum to the room, so no grant
      // overflows it, and what no expectation covers goes to the first lender (a lender gives only what it has).
      const expected = chosen.reduce((sum, c) => sum + c.expected, 0);
      const want = need.wantMicros;
      let left = want;
      for (const c of chosen) {
        const amount = want >= expected ? c.expected : Math.floor((want * c.expected) / expected);
        if (amount >= 1) {
          asks.push({ lender: c.lender, mode: need.mode, amountMicros: amount, expectedMicros: c.expected });
          left -= amount;
        }
      }
      if (left > 0) {
        const first = asks[0];
        if (first !== undefined) first.amountMicros += left;
        else if (chosen[0] !== undefined)
          asks.push({ lender: chosen[0].lender, mode: need.mode, amountMicros: left, expectedMicros: 0 });
      }
    }
    return { asks, held, dry };
  }

  /** Learn from a lender's answer to `ask` for `need`, at `now`. */
  record(need: BorrowNeed, ask: LoanAsk, answer: LoanAnswer, now: number): void {
    if (answer.kind === 'late') return;
    if (answer.kind === 'timeout') {
      const rtt = this.#rtt.get(ask.lender);
      const evidence = rtt === undefined ? TIMEOUT_EVIDENCE_MS : 2 * rtt;
      if (answer.waitedMs >= evidence)
        this.#backoff.set(ask.lender, now + this.settings.unreachableBackoffMs);
      return;
    }
    if (answer.kind === 'unreachable') {
      this.#backoff.set(ask.lender, now + this.settings.unreachableBackoffMs);
      return;
    }
    if (answer.rttMs !== undefined && answer.rttMs >= 0) {
      const before = this.#rtt.get(ask.lender);
      this.#rtt.set(
        ask.lender,
        before === undefined ? answer.rttMs : before + RTT_WEIGHT * (answer.rttMs - before),
      );
    }
    this.#backoff.delete(ask.lender);
    if (answer.kind === 'refused') {
      this.#put(need, ask.lender, {
        remaining: 0,
        at: now,
        short: true,
        mode: 'fill',
        fullAt: 0,
        fullAmount: 0,
        dryUntil: now + this.settings.unreachableBackoffMs,
      });
      return;
    }
    const { grantedMicros, remainingMicros, refillMs } = answer.grant;
    // What it has left is remembered (plan() expects it plus its refill since); one that says it will never
    // refill is dry for MAX_DRY_MS.
    const dryUntil = grantedMicros < ask.amountMicros && refillMs === null ? now + MAX_DRY_MS : 0;
    this.#put(need, ask.lender, {
      remaining: remainingMicros,
      at: now,
      short: grantedMicros < ask.amountMicros,
      mode: ask.mode,
      fullAt: refillMs === null ? 0 : now + Math.max(1, refillMs),
      fullAmount: ask.amountMicros,
      dryUntil,
    });
  }

  /** True while a borrow for (policy, subject) runs. */
  running(policy: string, subject: string): boolean {
    return this.#flights.has(policy + SEP + subject);
  }

  /**
   * Single flight per (policy, subject): while a borrow of the same `kind` runs, other callers get the same
   * promise instead of starting their own. A borrow of another kind running (a top-up, when a refusal needs a
   * fill: a top-up takes only what lenders hold above their reserve, so its outcome says nothing of the rest)
   * is waited for, and the call resolves `undefined` without borrowing: what the caller knew of its bucket is
   * stale, it decides again first. Once a borrow settles, the next call starts afresh.
   */
  async once<T>(
    policy: string,
    subject: string,
    kind: string,
    borrow: () => Promise<T>,
  ): Promise<T | undefined> {
    const key = policy + SEP + subject;
    const running = this.#flights.get(key);
    if (running !== undefined) {
      if (running.kind === kind) return running.promise as Promise<T>;
      await running.promise.catch(() => undefined);
      return undefined;
    }
    const promise = borrow().finally(() => this.#flights.delete(key));
    this.#flights.set(key, { kind, promise });
    return promise;
  }

  /** The entry of (need's subject, lender) without touching its recency. */
  #peekQuiet(need: BorrowNeed, lender: string): Entry | undefined {
    return this.#entries.get(need.policy + SEP + need.subject + SEP + lender);
  }

  #peek(need: BorrowNeed, lender: string): Entry | undefined {
    const key = need.policy + SEP + need.subject + SEP + lender;
    const entry = this.#entries.get(key);
    if (entry !== undefined) {
      this.#entries.delete(key);
      this.#entries.set(key, entry);
    }
    return entry;
  }

  #put(need: BorrowNeed, lender: string, entry: Entry): void {
    const key = need.policy + SEP + need.subject + SEP + lender;
    this.#entries.delete(key);
    this.#entries.set(key, entry);
    while (this.#entries.size > this.settings.maxEntries) {
      const oldest = this.#entries.keys().next();
      if (oldest.done === true) break;
      this.#entries.delete(oldest.value);
    }
  }
}
