/**
 * One borrow, end to end and pure: plan a round, ask the lenders (in parallel), learn from their answers, credit
 * what came back in one call, and go again while the need is not covered, lenders remain and time is left.
 *
 * The rules live in `BorrowSession`, a synchronous state machine that takes the answers as they come: the agent
 * drives it with promises (`runBorrow`, over NATS and Redis), the simulator with callbacks on its event queue
 * (over its network and in-memory buckets). The same rules in both.
 */
import type { LoanRequest } from '../wire/loan.js';
import type { BorrowNeed, BorrowPlanner, LoanAnswer, LoanAsk } from './planner.js';

/** What a borrow needs from the world, for `runBorrow`. */
export interface BorrowPorts {
  /** Ask one lender; resolve by `deadlineAt` (epoch ms) at the latest, `late` when the wait ran out. */
  ask(ask: LoanAsk, deadlineAt: number): Promise<LoanAnswer>;
  /**
   * Credit granted micro-tokens (fill) to the borrower's bucket; resolves what found room and what was dropped.
   * Throws when the store failed (the grant is then lost, which is safe).
   */
  credit(grantedMicros: number): Promise<{ credited: number; dropped: number }>;
  /** Epoch ms. */
  now(): number;
}

/**
 * How a borrow ended.
 * - `covered`: the need is covered (credited, or spent remotely): decide again.
 * - `subject_exhausted`: every other region was asked or is known dry: the subject used its global budget.
 * - `share_exhausted`: budget may be left elsewhere but could not be had in time (a lender unreachable or backed
 *   off, the deadline, the lender limit).
 */
export type BorrowOutcome = 'covered' | 'subject_exhausted' | 'share_exhausted';

export interface BorrowResult {
  outcome: BorrowOutcome;
  /** Micro-tokens added to the borrower's bucket. */
  credited: number;
  /** Micro-tokens granted that found no room (or were lost to a failed credit). */
  dropped: number;
  /** True when a lender charged the cost itself (`spend`): the request is admitted. */
  spent: boolean;
  /** Loan requests sent, by how they were answered. */
  asks: { lender: string; answer: LoanAnswer['kind']; grantedMicros: number }[];
  /** True when crediting failed (the store): the granted tokens are lost. */
  creditFailed: boolean;
}

/** A bucket of one subject that lacked tokens: what the borrower asks for (script units: micro-tokens). */
export interface Shortfall {
  /** The policy as the subject sees it: its class's capacity and refill when it has one. */
  policy: { name: string; capacity: number; refillPerSecond: number };
  subject: string;
  /** The subject's class, when it has one: the lenders size its bucket by it. */
  subjectClass?: string | undefined;
  borrower: string;
  /** Shares by region for this subject (an estimate for ordering lenders). */
  shares: Readonly<Record<string, number>>;
  /** The borrower's bucket capacity, the refused request's cost and what the bucket held, micro-tokens. */
  capacityMicros: number;
  costMicros: number;
  remainingMicros: number;
}

/**
 * The need of a refused check: the tokens it lacks, and the room its bucket has, which is what the borrower asks
 * for in all (a fill moves the room, so the next requests do not need a hop).
 */
export function shortfallNeed(short: Shortfall): BorrowNeed {
  const remaining = Math.max(0, short.remainingMicros);
  const needMicros = Math.max(1, short.costMicros - remaining);
  return {
    policy: short.policy.name,
    subject: short.subject,
    ...(short.subjectClass === undefined ? {} : { subjectClass: short.subjectClass }),
    capacity: short.policy.capacity,
    refillPerSecond: short.policy.refillPerSecond,
    borrower: short.borrower,
    shares: short.shares,
    mode: 'fill',
    needMicros,
    wantMicros: Math.max(needMicros, short.capacityMicros - remaining),
  };
}

/** By default a borrower tops its bucket up once an admission leaves it below half full. */
export const DEFAULT_LOW_WATER = 0.5;

/**
 * The need of a bucket an admission left below `lowWater` of its capacity (0 turns it off): borrow ahead, off
 * the request path, so the subject's next requests find tokens at home instead of waiting for a round trip. It
 * asks for the room and needs at least what brings the bucket back to the mark, so a lender that cannot give
 * that much is left alone until its refill could (the planner's dry memory), and a subject busy everywhere does
 * not shuffle crumbs between regions. Undefined when the bucket is not below the mark.
 */
export function lowWaterNeed(short: Shortfall, lowWater: number): BorrowNeed | undefined {
  const mark = Math.floor(short.capacityMicros * lowWater);
  const remaining = Math.max(0, short.remainingMicros);
  if (!(lowWater > 0) || remaining >= mark) return undefined;
  return { ...shortfallNeed({ ...short, costMicros: mark }), mode: 'spare' };
}

/**
 * Time a borrow keeps after its loans for the credit and the decision after it: two store calls, each bounded by
 * the store timeout, ms.
 */
export function borrowReserveMs(storeTimeoutMs: number): number {
  return 2 * storeTimeoutMs;
}

/**
 * Until when (epoch ms) a borrow may wait for lenders, for a decision due by `deadlineAt`: time is kept after the
 * loans for the credit and the decision after it, `reserveMs` (the store timeout), at most half of what is left.
 */
export function askDeadline(deadlineAt: number, now: number, reserveMs: number): number {
  return deadlineAt - Math.min(reserveMs, Math.max(0, deadlineAt - now) / 2);
}

/**
 * The loan request of `ask` for `need`, sent at `now` by a borrower that waits until `until` (epoch ms), under
 * policy `version`; undefined when less than a millisecond is left (the answer would be `late`).
 */
export function loanRequest(
  need: BorrowNeed,
  ask: LoanAsk,
  version: number,
  until: number,
  now: number,
  answerMs = 0,
): LoanRequest | undefined {
  const budgetMs = Math.floor(until - now);
  if (budgetMs < 1) return undefined;
  // The lender must lend by the time its answer can still travel back (`answerMs`, one way of the link): a loan
  // made later reaches a borrower that stopped waiting, and is dropped.
  const lendBy = Math.floor(until - Math.max(0, answerMs));
  if (lendBy - now < 1) return undefined;
  return {
    fromRegion: need.borrower,
    policy: need.policy,
    version,
    subject: need.subject,
    ...(need.subjectClass === undefined ? {} : { class: need.subjectClass }),
    mode: ask.mode,
    amountMicros: ask.amountMicros,
    budgetMs,
    deadlineAtMs: lendBy,
  };
}

/** Rounds of asks one borrow may take (each after the previous one's answers). */
export const MAX_BORROW_ROUNDS = 3;

/**
 * The state of one borrow. Call `nextRound(now)`; send its asks; give their answers, in the same order, to
 * `answered(answers, now)`; when that returns micro-tokens to credit, credit them and report with `credited` (or
 * `creditFailed`); repeat until `nextRound` returns undefined, then read `result(now)`.
 */
export class BorrowSession {
  readonly #planner: BorrowPlanner;
  readonly #deadlineAt: number;
  #current: BorrowNeed;
  #round = 0;
  #asks: LoanAsk[] | undefined;
  #pendingCredit = 0;
  #over = false;
  readonly #result: BorrowResult = {
    outcome: 'share_exhausted',
    credited: 0,
    dropped: 0,
    spent: false,
    asks: [],
    creditFailed: false,
  };

  constructor(planner: BorrowPlanner, need: BorrowNeed, deadlineAt: number) {
    this.#planner = planner;
    this.#current = { ...need };
    this.#deadlineAt = deadlineAt;
  }

  /** The asks of the next round, or undefined when the borrow is over. */
  nextRound(now: number): LoanAsk[] | undefined {
    if (this.#asks !== undefined || this.#pendingCredit > 0) {
      throw new Error('the previous round is not answered yet');
    }
    if (this.#over || this.#round >= MAX_BORROW_ROUNDS || now >= this.#deadlineAt) {
      this.#over = true;
      return undefined;
    }
    this.#round++;
    const plan = this.#planner.plan(this.#current, now, this.#deadlineAt);
    if (plan.asks.length === 0) {
      this.#over = true;
      return undefined;
    }
    this.#asks = plan.asks;
    return plan.asks;
  }

  /**
   * The answers to the round's asks (same order), at `now`. Returns the micro-tokens to credit to the borrower's
   * bucket now (0: nothing to credit).
   */
  answered(answers: readonly LoanAnswer[], now: number): number {
    const asks = this.#asks;
    if (asks === undefined || answers.length !== asks.length) {
      throw new Error(`expected ${asks?.length ?? 0} answers, got ${answers.length}`);
    }
    this.#asks = undefined;
    let granted = 0;
    asks.forEach((ask, i) => {
      const answer = answers[i]!;
      this.#planner.record(this.#current, ask, answer, now);
      const got = answer.kind === 'grant' ? answer.grant.grantedMicros : 0;
      this.#result.asks.push({ lender: ask.lender, answer: answer.kind, grantedMicros: got });
      granted += got;
    });
    if (this.#current.mode === 'spend') {
      if (granted > 0) {
        this.#result.spent = true;
        this.#result.outcome = 'covered';
        this.#over = true;
      }
      return 0;
    }
    if (granted >= this.#current.needMicros) {
      this.#result.outcome = 'covered';
      this.#over = true;
    } else if (granted > 0) {
      this.#current = {
        ...this.#current,
        needMicros: this.#current.needMicros - granted,
        wantMicros: Math.max(this.#current.needMicros - granted, this.#current.wantMicros - granted),
      };
    }
    this.#pendingCredit = granted;
    return granted;
  }

  /** What the credit of the last round's grants found room for. */
  credited(outcome: { credited: number; dropped: number }): void {
    this.#pendingCredit = 0;
    this.#result.credited += outcome.credited;
    this.#result.dropped += outcome.dropped;
  }

  /** The credit failed (the store): the grants are lost, which is safe, and the borrow ends. */
  creditFailed(): void {
    this.#result.dropped += this.#pendingCredit;
    this.#pendingCredit = 0;
    this.#result.creditFailed = true;
    this.#result.outcome = 'share_exhausted';
    this.#over = true;
  }

  /** How the borrow ended (call once `nextRound` returned undefined). */
  result(now: number): BorrowResult {
    if (this.#result.outcome !== 'covered' && !this.#result.creditFailed) {
      const after = this.#planner.plan(this.#current, now, this.#deadlineAt);
      this.#result.outcome =
        after.asks.length === 0 && after.held.length === 0 ? 'subject_exhausted' : 'share_exhausted';
    }
    return this.#result;
  }
}

/** Run one borrow with promises: the agent's form of `BorrowSession`. */
export async function runBorrow(
  planner: BorrowPlanner,
  need: BorrowNeed,
  ports: BorrowPorts,
  deadlineAt: number,
): Promise<BorrowResult> {
  const session = new BorrowSession(planner, need, deadlineAt);
  for (let asks = session.nextRound(ports.now()); asks !== undefined; asks = session.nextRound(ports.now())) {
    const answers = await Promise.all(asks.map((a) => ports.ask(a, deadlineAt)));
    const granted = session.answered(answers, ports.now());
    if (granted > 0) {
      try {
        session.credited(await ports.credit(granted));
      } catch {
        session.creditFailed();
      }
    }
  }
  return session.result(ports.now());
}
