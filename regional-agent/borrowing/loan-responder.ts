/**
 * The lending side of an agent: it joins its region's loan queue group and, for a subject another region is
 * short of, takes what this region's bucket of that subject holds (lua/lend.lua, sized from this region's own
 * share and policy) and answers how much it gave. Schema-checked; a bad or unanswerable request takes nothing.
 */
import type { NatsConnection, Subscription } from '@nats-io/nats-core';
import { acceptLoan, grantReply, lendBy, sizeLend } from '../../core/borrowing/lender.js';
import { bucketKey } from '../../core/keys.js';
import type { PolicySource } from '../policies/policy-source.js';
import type { ShareView } from '../../core/shares/shares.js';
import { MICRO } from '../../core/models/token-bucket.js';
import { DEFAULT_KV_NAMESPACE } from '../../core/wire/kv.js';
import { LoanRequest, loanSubject, type LoanErrorCode, type LoanReply } from '../../core/wire/loan.js';
import { LendTooLateError, type EncodedLendResult } from '../../core/models/transfer.js';
import { DEFAULT_LEND_BUDGET_SUBJECTS, LendBudget } from '../../core/borrowing/loan-bounds.js';
import { hasOwnKey } from '../../core/own-keys.js';
import type { BorrowMetrics } from './borrow-metrics.js';
import type { TransferStore } from './transfer-store.js';

export interface LoanResponderOptions {
  nc: NatsConnection;
  region: string;
  namespace?: string | undefined;
  policies: PolicySource;
  shares: ShareView;
  store: TransferStore;
  /** Admission control: a function to call once answered, or a reason to shed the request (`overloaded`). */
  admit?: (() => (() => void) | string) | undefined;
  metrics?: BorrowMetrics | undefined;
  /**
   * What one requesting region may take from this region's buckets, per policy (core/borrowing/loan-bounds.ts).
   * Default: DEFAULT_LEND_BUDGET_SUBJECTS bursts, remembered for 10,000 (region, policy) pairs.
   */
  budget?: LendBudget | undefined;
  /** Monotonic ms for the lend budget's refill; default performance.now. */
  monotonic?: (() => number) | undefined;
  log?: { warn(obj: object, msg?: string): void } | undefined;
  /**
   * Whether a region is one this agent knows (one its allocation records name). A request from any other is
   * refused before anything reads it further, and counted as `from="other", outcome="unknown_region"`: the
   * origin becomes a metric label, so a made-up name must never reach one. Default: every name is known.
   */
  knownRegion?: ((region: string) => boolean) | undefined;
}

export class LoanResponder {
  readonly #o: LoanResponderOptions;
  #subscription: Subscription | undefined;
  readonly #inFlight = new Set<Promise<void>>();
  readonly #budget: LendBudget;
  readonly #monotonic: () => number;

  constructor(options: LoanResponderOptions) {
    this.#o = options;
    this.#budget = options.budget ?? new LendBudget(DEFAULT_LEND_BUDGET_SUBJECTS, 10_000);
    this.#monotonic = options.monotonic ?? (() => performance.now());
  }

  start(): void {
    const { subject, queue } = loanSubject(this.#o.namespace ?? DEFAULT_KV_NAMESPACE, this.#o.region);
    this.#subscription = this.#o.nc.subscribe(subject, {
      queue,
      callback: (error, msg) => {
        if (error !== null) return;
        const work = this.#handle(msg.data).then((reply) => {
          if (msg.reply !== undefined && msg.reply !== '') msg.respond(JSON.stringify(reply));
        });
        this.#inFlight.add(work);
        void work.finally(() => this.#inFlight.delete(work));
      },
    });
  }

  /** Leave the queue group (the region's other agents answer) and finish the requests already taken. */
  async stop(): Promise<void> {
    this.#subscription?.unsubscribe();
    this.#subscription = undefined;
    await Promise.allSettled([...this.#inFlight]);
  }

  /** Answer one loan request (exported through the subscription; also the unit under test). */
  async answer(value: unknown): Promise<LoanReply> {
    const parsed = LoanRequest.safeParse(value);
    if (!parsed.success) {
      const message = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
      return this.#error('unknown', 'invalid_request', message);
    }
    const request = parsed.data;
    const from = request.fromRegion;
    // The requesting region names itself: first, only a region this agent knows, never this one (the name is a
    // metric label from here on: a made-up one would be one more series, and one more lend budget).
    if (from === this.#o.region || !(this.#o.knownRegion?.(from) ?? true)) return this.#unknownRegion(from);
    const lendUntil = lendBy(request);
    const accepted = acceptLoan(request, this.#o.policies.current().get(request.policy), Date.now());
    if (!('policy' in accepted)) return this.#error(from, accepted.error, accepted.message);
    const { policy } = accepted;
    // Then only a region that holds a share of this subject here.
    const regions = this.#o.shares.regionCeilings?.(policy.name, request.subject);
    if (regions !== undefined && !hasOwnKey(regions, from)) return this.#unknownRegion(from);
    const admitted = this.#o.admit?.() ?? (() => undefined);
    if (typeof admitted === 'string')
      return this.#error(from, 'overloaded', `the lender is overloaded (${admitted.replace(/_/g, ' ')})`);
    // Lending uses this region's share as a decision does: the epoch is not acknowledged until it is done.
    const leave = this.#o.shares.enter(policy.name);
    try {
      const sized = sizeLend(
        request,
        policy,
        this.#o.shares.shareFor(policy.name, request.subject),
        bucketKey(policy.version, request.subject, policy.name),
      );
      if (!('lend' in sized)) return this.#error(from, sized.error, sized.message);
      const budgetKey = `${policy.name}\u0000${request.class ?? ''}`;
      const reserved = this.#budget.reserve(
        from,
        budgetKey,
        policy,
        sized.lend.amount,
        sized.lend.mode,
        this.#monotonic(),
      );
      if (reserved === 0) {
        return this.#error(
          from,
          'overloaded',
          `the lend budget of region ${from} for ${policy.name} is spent`,
        );
      }
      let given = 0;
      try {
        const result = await this.#o.store.lend({ ...sized.lend, amount: reserved }, lendUntil);
        given = result.granted;
        return this.#served(policy.name, from, result);
      } finally {
        this.#budget.settle(from, budgetKey, reserved, given);
      }
    } catch (error) {
      if (error instanceof LendTooLateError)
        return this.#error(from, 'deadline', 'the lend ran after the borrower stopped waiting');
      this.#o.log?.warn({ err: error }, 'loan responder: the lend failed');
      return this.#error(from, 'failed', 'the lender could not reach its store');
    } finally {
      leave();
      admitted();
    }
  }

  #served(policy: string, from: string, result: EncodedLendResult): LoanReply {
    this.#o.metrics?.loansServed.inc({ from, outcome: result.granted > 0 ? 'granted' : 'dry' });
    if (result.granted > 0) this.#o.metrics?.lentTokens.inc({ policy }, result.granted / MICRO);
    return grantReply(result);
  }

  async #handle(data: Uint8Array): Promise<LoanReply> {
    let value: unknown;
    try {
      value = JSON.parse(new TextDecoder().decode(data));
    } catch {
      value = undefined;
    }
    return this.answer(value);
  }

  /** A request naming no region it may come from: `invalid_request` on the wire, `unknown_region` in metrics. */
  #unknownRegion(from: string): LoanReply {
    this.#o.metrics?.loansServed.inc({ from: 'other', outcome: 'unknown_region' });
    return { error: 'invalid_request', message: `unknown requesting region ${from}`.slice(0, 300) };
  }

  #error(from: string, code: LoanErrorCode, message: string): LoanReply {
    this.#o.metrics?.loansServed.inc({ from, outcome: code });
    return { error: code, message: message.slice(0, 300) };
  }
}
