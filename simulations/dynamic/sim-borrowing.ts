/**
 * Borrowing in the `dynamic` strategy, as the agent does it (regional-agent/borrowing/): a request refused for
 * lack of its region's tokens waits while its agent borrows the subject's own tokens from the other regions'
 * buckets, then is decided once more. The rules are core's: the planner (whom to ask, how much, what an answer
 * teaches), `BorrowSession` (rounds, credit, outcome), the need and deadline of a shortfall, and the lender's
 * checks and sizing (core/borrowing/lender.ts); lends and credits run core's transfer arithmetic on the region's
 * simulated Redis. Loan requests and replies travel the simulated network as `control` messages, so delay,
 * jitter, loss and partitions apply and each counts in `controlMessagesPerSecond`.
 *
 * As in the agent: one borrow per (agent, subject) at a time, and refusals of that subject that arrive while it
 * runs wait for it together; a request may be covered and decided again MAX_COVER_ATTEMPTS times (a borrow can
 * be raced away by other requests of the subject) and never after its deadline; a refusal after borrowing says
 * why (`subject_exhausted`: the other regions are dry; `share_exhausted`: budget may be left elsewhere).
 */
import {
  askDeadline,
  BorrowSession,
  loanRequest,
  lowWaterNeed,
  shortfallNeed,
  type BorrowOutcome,
  type Shortfall,
} from '../../core/borrowing/borrow.js';
import { acceptLoan, grantReply, loanAnswer, sizeLend } from '../../core/borrowing/lender.js';
import {
  BorrowPlanner,
  type BorrowNeed,
  type BorrowPlannerSettings,
  type LoanAnswer,
  type LoanAsk,
} from '../../core/borrowing/planner.js';
import type { Policy } from '../../core/policy/policy.js';
import { MICRO, type EncodedCheck } from '../../core/models/token-bucket.js';
import type { LoanReply } from '../../core/wire/loan.js';
import {
  PENDING,
  type Outcome,
  type RefusalReason,
  type SimRequest,
  type StrategyContext,
} from '../strategy.js';
import type { Evaluation, SimAgent } from './agent-node.js';
import { subjectId, subjectName } from './subject-name.js';
import type { VirtualClock } from './virtual-clock.js';
import { SubjectPolicies } from '../engine/subject-classes.js';

/** Times one request may be covered and decided again, as the agent's store group allows. */
export const MAX_COVER_ATTEMPTS = 3;

export interface SimBorrowingOptions {
  planner: BorrowPlannerSettings;
  /** Top a bucket up once an admission leaves it below this fraction of its capacity (0: never). */
  lowWater: number;
  /** A decision's deadline from its arrival, ms (the agent's `decisionDeadlineMs`). */
  deadlineMs: number;
  /** Time kept after the loans for the credit and the second decision, ms (the agent's store timeout). */
  reserveMs: number;
}

interface Waiter {
  request: SimRequest;
  /** Epoch ms of the agent's clock by which it must be answered. */
  deadlineAt: number;
  attempts: number;
  refusal: RefusalReason | undefined;
}

interface Flight {
  agent: SimAgent;
  subject: number;
  /** A refusal's fill, or a top-up (whose outcome says nothing of what a fill would get). */
  kind: 'refusal' | 'top_up';
  waiters: Waiter[];
}

const flightKey = (agent: SimAgent, subject: number): string => `${agent.id}\u0000${subject}`;

export class SimBorrowing {
  readonly #ctx: StrategyContext;
  readonly #policy: Policy;
  readonly #policies: SubjectPolicies;
  readonly #clock: VirtualClock;
  readonly #options: SimBorrowingOptions;
  /** The agents of each region; a loan goes to one of them, in turn, as to a queue group. */
  readonly #byRegion: readonly (readonly SimAgent[])[];
  readonly #turn: number[];
  readonly #planners = new Map<SimAgent, BorrowPlanner>();
  readonly #flights = new Map<string, Flight>();
  /** Micro-tokens lent, dropped at a credit (no room) and lost (granted after the borrower stopped waiting). */
  readonly #micros = { lent: 0, dropped: 0, lost: 0 };

  constructor(
    ctx: StrategyContext,
    clock: VirtualClock,
    byRegion: readonly (readonly SimAgent[])[],
    options: SimBorrowingOptions,
  ) {
    this.#ctx = ctx;
    this.#policy = ctx.policy;
    this.#policies = new SubjectPolicies(ctx.policy);
    this.#clock = clock;
    this.#byRegion = byRegion;
    this.#turn = byRegion.map(() => 0);
    this.#options = options;
  }

  /**
   * `request` was refused on `agent` for lack of its region's tokens (`evaluation.short`): borrow, decide again
   * and complete it later. Returns PENDING.
   */
  cover(agent: SimAgent, request: SimRequest, evaluation: Evaluation): typeof PENDING {
    const waiter: Waiter = {
      request,
      deadlineAt: this.#clock.now() + this.#options.deadlineMs,
      attempts: 0,
      refusal: undefined,
    };
    this.#wait(agent, waiter, evaluation);
    return PENDING;
  }

  /**
   * An admission left `subject`'s bucket on `agent` below the low-water mark: borrow ahead, with nobody waiting
   * (a refusal that comes meanwhile joins the borrow).
   */
  topUp(agent: SimAgent, subject: number, evaluation: Evaluation): void {
    const b = evaluation.bucket;
    if (b === undefined || this.#flights.has(flightKey(agent, subject))) return;
    const need = lowWaterNeed(this.#shortfall(agent, subject, b), this.#options.lowWater);
    if (need === undefined) return;
    this.#ctx.count('topUps');
    this.#fly(agent, subject, b.check, need, this.#clock.now() + this.#options.deadlineMs, [], 'top_up');
  }

  /** Join the borrow of the waiter's subject in flight on `agent`, or start one. */
  #wait(agent: SimAgent, waiter: Waiter, evaluation: Evaluation): void {
    const subject = waiter.request.subject;
    const running = this.#flights.get(flightKey(agent, subject));
    if (running !== undefined) {
      // A top-up's outcome is not this waiter's: it is decided again after it, and borrows itself if still short.
      if (running.kind === 'refusal') waiter.attempts++;
      running.waiters.push(waiter);
      return;
    }
    waiter.attempts++;
    const b = evaluation.bucket!;
    const need = shortfallNeed(this.#shortfall(agent, subject, b));
    this.#fly(agent, subject, b.check, need, waiter.deadlineAt, [waiter], 'refusal');
  }

  #shortfall(agent: SimAgent, subject: number, b: { check: EncodedCheck; remaining: number }): Shortfall {
    const name = subjectName(subject);
    return {
      // The policy as the subject sees it, and its class for the lenders (engine/subject-classes.ts).
      policy: this.#policies.of(subject),
      subject: name,
      subjectClass: this.#policies.classOf(subject),
      borrower: agent.regionName,
      shares: agent.lease.regionShares(this.#policy.name, name) ?? {},
      capacityMicros: b.check.capacity,
      costMicros: b.check.cost,
      remainingMicros: b.remaining,
    };
  }

  /** Run one borrow for `need` of `subject` on `agent`, then decide its waiters again. */
  #fly(
    agent: SimAgent,
    subject: number,
    check: EncodedCheck,
    need: BorrowNeed,
    deadlineAt: number,
    waiters: Waiter[],
    kind: Flight['kind'],
  ): void {
    const key = flightKey(agent, subject);
    const flight: Flight = { agent, subject, kind, waiters };
    this.#flights.set(key, flight);
    const until = askDeadline(deadlineAt, this.#clock.now(), this.#options.reserveMs);
    const session = new BorrowSession(this.#planner(agent), need, until);
    const { cost: _cost, ...bucket } = check;
    const round = (): void => {
      const asks = session.nextRound(this.#clock.now());
      if (asks === undefined) {
        this.#flights.delete(key);
        this.#decideAgain(flight, session.result(this.#clock.now()).outcome);
        return;
      }
      this.#ask(agent, need, asks, until, (answers) => {
        const granted = session.answered(answers, this.#clock.now());
        if (granted > 0) {
          const store = this.#ctx.stores[agent.region]!;
          const credit = store.credit(subject, { bucket, amount: granted }, this.#ctx.now());
          this.#micros.dropped += credit.dropped;
          if (credit.credited > 0) agent.imported(credit.credited / MICRO);
          session.credited(credit);
        }
        round();
      });
    };
    round();
  }

  /** Send one round's asks and call `done` with their answers, in order, by `until` at the latest. */
  #ask(
    agent: SimAgent,
    need: BorrowNeed,
    asks: readonly LoanAsk[],
    until: number,
    done: (answers: LoanAnswer[]) => void,
  ): void {
    const ctx = this.#ctx;
    const answers: (LoanAnswer | undefined)[] = asks.map(() => undefined);
    const sentAt = this.#clock.now();
    let open = asks.length;
    let over = false;
    const finish = () => {
      if (over) return;
      over = true;
      // No answer by the deadline: the request timed out on the wire, as the agent's asker reports it.
      const waitedMs = this.#clock.now() - sentAt;
      const all = answers.map((a): LoanAnswer => a ?? { kind: 'timeout', waitedMs });
      for (const a of all) ctx.count(`loanAnswers:${a.kind}`);
      done(all);
    };
    asks.forEach((ask, i) => {
      const request = loanRequest(need, ask, this.#policy.version, until, this.#clock.now());
      if (request === undefined) {
        answers[i] = { kind: 'late' };
        if (--open === 0) finish();
        return;
      }
      const lender = ctx.regions.indexOf(ask.lender);
      ctx.count('loanMessages');
      ctx.network.send(agent.region, lender, 'control', () => {
        const reply = this.#lend(lender, request);
        ctx.count('loanMessages');
        ctx.network.send(lender, agent.region, 'control', () => {
          if (over) {
            // The borrower stopped waiting: what the lender gave is lost (safe: nothing is minted).
            if (!('error' in reply)) this.#micros.lost += reply.grantedMicros;
            return;
          }
          answers[i] = loanAnswer(reply, this.#clock.now() - sentAt);
          if (--open === 0) finish();
        });
      });
    });
    if (open === 0) return;
    ctx.at(Math.max(ctx.now(), this.#clock.toVirtualUs(until)), finish);
  }

  /** A lender region's agent answers a loan request on its region's store. */
  #lend(region: number, request: NonNullable<ReturnType<typeof loanRequest>>): LoanReply {
    const agents = this.#byRegion[region]!;
    const agent = agents[this.#turn[region]!++ % agents.length]!;
    const accepted = acceptLoan(request, this.#policy, this.#clock.now());
    if (!('policy' in accepted)) return { error: accepted.error, message: accepted.message };
    const leave = agent.lease.enter(this.#policy.name);
    try {
      const sized = sizeLend(
        request,
        accepted.policy,
        agent.lease.shareFor(this.#policy.name, request.subject),
        request.subject,
      );
      if (!('lend' in sized)) return { error: sized.error, message: sized.message };
      const { key: _key, ...lend } = sized.lend;
      const subject = subjectId(request.subject);
      this.#ctx.count('loansServed');
      const result = this.#ctx.stores[region]!.lend(subject, lend, this.#ctx.now());
      this.#micros.lent += result.granted;
      return grantReply(result);
    } finally {
      leave();
    }
  }

  /** The borrow is over: decide each waiter once more, in arrival order; one still short may borrow again. */
  #decideAgain(flight: Flight, outcome: BorrowOutcome): void {
    const ctx = this.#ctx;
    const store = ctx.stores[flight.agent.region]!;
    const now = this.#clock.now();
    for (const waiter of flight.waiters) {
      waiter.refusal = outcome === 'covered' || flight.kind === 'top_up' ? 'share_exhausted' : outcome;
      const evaluation = flight.agent.evaluate(waiter.request, store, ctx.now());
      const retry =
        evaluation.short &&
        (outcome === 'covered' || flight.kind === 'top_up') &&
        waiter.attempts < MAX_COVER_ATTEMPTS &&
        now < waiter.deadlineAt;
      if (retry) {
        this.#wait(flight.agent, waiter, evaluation);
        continue;
      }
      const result: Outcome = { ...evaluation.outcome };
      if (!result.allowed && evaluation.short) result.refusal = waiter.refusal;
      flight.agent.record(waiter.request, result.allowed, evaluation.remainingFraction);
      ctx.count(result.allowed ? 'borrowedAdmissions' : `borrowRefusals:${waiter.refusal}`);
      ctx.complete(waiter.request, result);
    }
  }

  /** Add the run's token counters, in whole tokens (results.json `counters`). */
  finish(): void {
    const tokens = {
      lentTokens: this.#micros.lent,
      droppedLoanTokens: this.#micros.dropped,
      lostLoanTokens: this.#micros.lost,
    };
    for (const [name, micros] of Object.entries(tokens)) {
      const whole = Math.round(micros / MICRO);
      if (whole > 0) this.#ctx.count(name, whole);
    }
  }

  #planner(agent: SimAgent): BorrowPlanner {
    let planner = this.#planners.get(agent);
    if (planner === undefined) {
      planner = new BorrowPlanner(this.#options.planner);
      this.#planners.set(agent, planner);
    }
    return planner;
  }
}
