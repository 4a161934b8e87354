/**
 * The borrowing side of an agent, behind the decision path's borrowing port (ShortfallHandler,
 * regional-agent/decisions/borrowing-port.ts): for a regional check refused for lack of this region's tokens,
 * it borrows the subject's own tokens from other regions (core/borrowing: the planner says whom to ask and how
 * much, runBorrow asks, credits and goes again) and lets the group be decided once more.
 * One borrow per (policy, subject) at a time: concurrent refusals of a subject wait on it together.
 * Every wait ends by the decision's deadline, less the time the credit and the second decision need.
 */
import type { DecisionReason } from '../../core/wire/agent.js';
import {
  askDeadline,
  loanRequest,
  lowWaterNeed,
  runBorrow,
  shortfallNeed,
  type BorrowResult,
  type Shortfall,
} from '../../core/borrowing/borrow.js';
import type { BorrowNeed, BorrowPlanner, LoanAnswer, LoanAsk } from '../../core/borrowing/planner.js';
import { transferBucket } from '../../core/models/transfer.js';
import { GrantCheck, lenderBound } from '../../core/borrowing/loan-bounds.js';
import { ownValue } from '../../core/own-keys.js';
import { encodeRequest } from '../../core/wire/bucket.js';
import type { Clock } from '../../core/clock.js';
import { oneWayAllowanceMs } from '../../core/distance.js';
import type { ShareView } from '../../core/shares/shares.js';
import { MICRO } from '../../core/models/token-bucket.js';
import type { LoanRequest } from '../../core/wire/loan.js';
import type {
  BorrowingCheck,
  ShortCheck,
  ShortfallHandler,
  ShortfallOutcome,
} from '../decisions/borrowing-port.js';
import type { BorrowMetrics } from './borrow-metrics.js';
import type { TransferStore } from './transfer-store.js';

/**
 * Sends one loan request to a lender region and resolves how it was answered, by `deadlineAt` at the latest. A
 * grant that arrives after the answer resolved `timeout` (the lender debited its bucket, the reply crossed the
 * link too slowly) is handed to `late` when given, so that its tokens are credited instead of lost.
 */
export type LoanAsker = (
  lender: string,
  request: LoanRequest,
  deadlineAt: number,
  late?: (answer: Extract<LoanAnswer, { kind: 'grant' }>) => void,
) => Promise<LoanAnswer>;

export interface BorrowerOptions {
  region: string;
  planner: BorrowPlanner;
  shares: ShareView;
  store: TransferStore;
  ask: LoanAsker;
  clock: Clock;
  /** Time kept after the loans for the credit and the second decision, ms (the store timeout, say). */
  reserveMs: number;
  /** Top a bucket up once an admission leaves it below this fraction of its capacity (0: never). */
  lowWater: number;
  /** How long a top-up may wait for its lenders, ms (the decision deadline and the farthest link's allowance). */
  topUpMs: number;
  /**
   * How much longer than its decision's deadline a refusal's borrow may wait for its lenders, ms: the link's
   * allowance (core/distance.ts linkAllowanceMs of the farthest lender), so a loan can cross it. Default 0.
   */
  linkAllowanceMs?: number | undefined;
  /** The round trip to a lender region, ms: its answer needs one way of it (default 0). */
  roundTripMs?: ((lender: string) => number) | undefined;
  metrics?: BorrowMetrics | undefined;
  /** Monotonic ms for the grant check's refill (core/borrowing/loan-bounds.ts); default performance.now. */
  monotonic?: (() => number) | undefined;
  /** Told of tokens credited here from other regions (the usage report counts them). */
  imported?: ((policy: string, tokens: number) => void) | undefined;
}

const refusalKey = (policy: string, subject: string): string => `${policy}\u0000${subject}`;

export class Borrower implements ShortfallHandler {
  readonly #o: BorrowerOptions;
  /** Refusals being covered now, by (policy, subject). */
  readonly #refusing = new Map<string, number>();
  /** Credits so far, by (policy, subject) (a bounded LRU: an evicted subject reads 0, which only costs a retry). */
  readonly #credits = new Map<string, number>();

  /** What each lender could have given, per (lender, policy, subject): grants above it are not believed. */
  readonly #grants: GrantCheck;
  readonly #monotonic: () => number;

  constructor(options: BorrowerOptions) {
    this.#o = options;
    this.#grants = new GrantCheck(options.planner.settings.maxEntries);
    this.#monotonic = options.monotonic ?? (() => performance.now());
  }

  async cover(short: readonly ShortCheck[], deadlineAt: number): Promise<ShortfallOutcome> {
    const keys = short.map((s) => refusalKey(s.check.policy.name, s.check.subject));
    for (const k of keys) this.#refusing.set(k, (this.#refusing.get(k) ?? 0) + 1);
    try {
      return await this.#cover(short, deadlineAt);
    } finally {
      for (const k of keys) {
        const left = (this.#refusing.get(k) ?? 1) - 1;
        if (left > 0) this.#refusing.set(k, left);
        else this.#refusing.delete(k);
      }
    }
  }

  generation(policy: string, subject: string): number {
    return this.#credits.get(refusalKey(policy, subject)) ?? 0;
  }

  /**
   * Whether a token can reach `check`'s bucket from other regions now: a borrow of its subject is in flight, or
   * the next refusal for one token would ask some lender (the planner's own judgement: a region known dry,
   * backed off or holding no share is not asked). Changes nothing but the planner's recency order.
   */
  mayLend(check: BorrowingCheck): boolean {
    // A borrow of the subject in flight (a top-up the admission just started, say) is bringing tokens.
    if (this.#o.planner.running(check.policy.name, check.subject)) return true;
    const need = shortfallNeed({
      ...this.#shortfall({ check, remaining: 0 }),
      costMicros: MICRO,
    });
    return this.#o.planner.plan(need, this.#o.clock.now()).asks.length > 0;
  }

  async #cover(short: readonly ShortCheck[], deadlineAt: number): Promise<ShortfallOutcome> {
    // Tokens were credited since the refusal was decided (a top-up finished): have the group decided again
    // first, since what the refusal saw of its bucket is stale (borrowing the room it saw would drop what came
    // in meanwhile). A top-up still running is waited for by `once`, to the same end.
    const stale = short.some(
      (s) =>
        s.generation !== undefined && s.generation !== this.generation(s.check.policy.name, s.check.subject),
    );
    if (stale) return { covered: true, waited: true, reasons: short.map(() => undefined) };
    const ran = await Promise.all(
      short.map((s) =>
        this.#o.planner.once(s.check.policy.name, s.check.subject, 'refusal', () =>
          this.#borrow(s, deadlineAt),
        ),
      ),
    );
    // A top-up started meanwhile and was waited for: decide again first.
    if (ran.some((r) => r === undefined))
      return { covered: true, waited: true, reasons: short.map(() => undefined) };
    const results = ran as BorrowResult[];
    return {
      covered: results.every((r) => r.outcome === 'covered'),
      reasons: results.map((r): DecisionReason | undefined =>
        r.outcome === 'covered' ? undefined : r.outcome,
      ),
    };
  }

  /**
   * Top up, off the request path, every bucket an admission left below the low-water mark: one borrow per
   * (policy, subject) at a time, so a top-up already running (or a refusal's borrow) is not doubled. A refusal
   * that comes meanwhile waits on it, as on any borrow of its subject.
   */
  admitted(checks: readonly ShortCheck[]): void {
    if (!(this.#o.lowWater > 0)) return;
    for (const short of checks) {
      const { policy, subject } = short.check;
      // Refusals of the subject come first (a top-up would only make them wait), and an admission decided
      // before a credit knows a stale level (topping up the room it saw would drop what came in).
      if (
        this.#o.planner.running(policy.name, subject) ||
        this.#refusing.has(refusalKey(policy.name, subject)) ||
        (short.generation !== undefined && short.generation !== this.generation(policy.name, subject))
      )
        continue;
      const need = lowWaterNeed(this.#shortfall(short), this.#o.lowWater);
      if (need === undefined) continue;
      const until = askDeadline(
        this.#o.clock.now() + this.#o.topUpMs,
        this.#o.clock.now(),
        this.#o.reserveMs,
      );
      void this.#o.planner.once(policy.name, subject, 'top_up', () =>
        this.#run(short, need, until, 'top_up'),
      );
    }
  }

  #noteCredit(policy: string, subject: string): void {
    const key = refusalKey(policy, subject);
    const n = (this.#credits.get(key) ?? 0) + 1;
    this.#credits.delete(key);
    this.#credits.set(key, n);
    if (this.#credits.size > this.#o.planner.settings.maxEntries) {
      const oldest = this.#credits.keys().next();
      if (oldest.done !== true) this.#credits.delete(oldest.value);
    }
  }

  #shortfall(short: ShortCheck): Shortfall {
    const { check } = short;
    const encoded = encodeRequest({ checks: [check.bucket] }).checks[0]!;
    return {
      policy: check.policy,
      subject: check.subject,
      subjectClass: check.subjectClass,
      borrower: this.#o.region,
      shares: this.#o.shares.regionShares?.(check.policy.name, check.subject) ?? {},
      capacityMicros: encoded.capacity,
      costMicros: encoded.cost,
      remainingMicros: Math.round(short.remaining * MICRO),
    };
  }

  #borrow(short: ShortCheck, deadlineAt: number): Promise<BorrowResult> {
    const need = shortfallNeed(this.#shortfall(short));
    const until = deadlineAt + (this.#o.linkAllowanceMs ?? 0);
    return this.#run(short, need, askDeadline(until, this.#o.clock.now(), this.#o.reserveMs), 'refusal');
  }

  async #run(
    short: ShortCheck,
    need: BorrowNeed,
    askUntil: number,
    kind: 'refusal' | 'top_up',
  ): Promise<BorrowResult> {
    const { check } = short;
    const { policy } = check;
    const { cost: _cost, ...bucketParams } = check.bucket;
    const bucket = transferBucket(bucketParams);
    const credit = (amount: number) => this.#o.store.credit({ key: check.bucket.key, bucket, amount });
    // The share this borrow's bucket parameters belong to: a late grant is credited only while it still holds.
    const shareEpoch = () => this.#o.shares.shareFor(policy.name, check.subject)?.epoch;
    const askedUnder = shareEpoch();
    const result = await runBorrow(
      this.#o.planner,
      need,
      {
        now: () => this.#o.clock.now(),
        ask: (ask: LoanAsk, until: number) =>
          this.#ask(ask, need, check.policy.version, until, (late, sentAt) => {
            void this.#creditLate(ask, need, late, sentAt, credit, () => shareEpoch() === askedUnder);
          }).then((answer) => {
            this.#o.metrics?.loanRequests.inc({ lender: ask.lender, answer: answer.kind });
            return answer;
          }),
        credit,
      },
      askUntil,
    );
    const m = this.#o.metrics;
    m?.borrows.inc({ policy: policy.name, kind, outcome: result.outcome });
    if (result.credited > 0) {
      this.#noteCredit(policy.name, check.subject);
      m?.borrowedTokens.inc({ policy: policy.name }, result.credited / MICRO);
      this.#o.imported?.(policy.name, result.credited / MICRO);
    }
    if (result.dropped > 0) {
      const reason = result.creditFailed ? 'credit_failed' : 'no_room';
      m?.droppedTokens.inc({ policy: policy.name, reason }, result.dropped / MICRO);
    }
    return result;
  }

  async #ask(
    ask: LoanAsk,
    need: BorrowNeed,
    version: number,
    until: number,
    late: (answer: Extract<LoanAnswer, { kind: 'grant' }>, sentAt: number) => void,
  ): Promise<LoanAnswer> {
    const answerMs = oneWayAllowanceMs(this.#o.roundTripMs?.(ask.lender) ?? 0);
    const request = loanRequest(need, ask, version, until, this.#o.clock.now(), answerMs);
    if (request === undefined) return { kind: 'late' };
    const sentAt = this.#monotonic();
    const answer = await this.#o.ask(ask.lender, request, until, (grant) => late(grant, sentAt));
    return answer.kind === 'grant' ? this.#believe(ask, need, answer, sentAt) : answer;
  }

  /**
   * A grant that came after its borrow stopped waiting for it: the lender took the tokens, so they are credited
   * to the bucket all the same (as far as the grant is believed; what finds no room is dropped, as any credit's).
   * A late `spend` is not: the lender charged the cost of a request that was answered without it.
   */
  async #creditLate(
    ask: LoanAsk,
    need: BorrowNeed,
    answer: Extract<LoanAnswer, { kind: 'grant' }>,
    sentAt: number,
    credit: (amount: number) => Promise<{ credited: number; dropped: number }>,
    sameShare: () => boolean,
  ): Promise<void> {
    if (ask.mode === 'spend') return;
    const believed = this.#believe(ask, need, answer, sentAt);
    const amount = believed.kind === 'grant' ? believed.grant.grantedMicros : 0;
    if (amount <= 0) return;
    const m = this.#o.metrics;
    if (!sameShare()) {
      // Past the decision, outside the enter/acknowledge protocol that keeps an on-time credit to the share in
      // force: under a newer share the bucket parameters taken at the refusal no longer hold (a refill at the old
      // rate across a shrink and regrowth would mint tokens), so the grant is dropped, which is safe.
      m?.droppedTokens.inc({ policy: need.policy, reason: 'share_moved' }, amount / MICRO);
      return;
    }
    m?.lateGrants?.inc({ lender: ask.lender });
    let outcome: { credited: number; dropped: number };
    try {
      outcome = await credit(amount);
    } catch {
      // The store failed: the tokens are lost, which is safe.
      m?.droppedTokens.inc({ policy: need.policy, reason: 'credit_failed' }, amount / MICRO);
      return;
    }
    if (outcome.credited > 0) {
      this.#noteCredit(need.policy, need.subject);
      m?.borrowedTokens.inc({ policy: need.policy }, outcome.credited / MICRO);
      this.#o.imported?.(need.policy, outcome.credited / MICRO);
    }
    if (outcome.dropped > 0) {
      m?.droppedTokens.inc({ policy: need.policy, reason: 'no_room' }, outcome.dropped / MICRO);
    }
  }

  /**
   * A grant as far as it can be believed: never more than asked, never more than the lender's share of the
   * subject could have held since (core/borrowing/loan-bounds.ts). A grant above what was asked is no lender's
   * answer: the region is treated as unreachable (backed off).
   */
  #believe(
    ask: LoanAsk,
    need: BorrowNeed,
    answer: Extract<LoanAnswer, { kind: 'grant' }>,
    sentAt: number,
  ): LoanAnswer {
    const ceilings = this.#o.shares.regionCeilings?.(need.policy, need.subject);
    const share = ceilings === undefined ? 0 : (ownValue(ceilings, ask.lender) ?? 0);
    const verdict = this.#grants.check(
      ask.lender,
      need.policy,
      need.subject,
      { mode: ask.mode, asked: ask.amountMicros, granted: answer.grant.grantedMicros },
      lenderBound(need.capacity, need.refillPerSecond, share),
      this.#monotonic(),
      sentAt,
    );
    if (verdict.problem === undefined) return answer;
    this.#o.metrics?.distrustedGrants?.inc({ lender: ask.lender, problem: verdict.problem });
    if (verdict.problem === 'over_asked') return { kind: 'unreachable' };
    return { ...answer, grant: { ...answer.grant, grantedMicros: verdict.believed } };
  }
}
