/**
 * Loan requests over NATS: request/reply to the lender region's queue group (one of its agents answers). Every
 * wait is bounded by the borrower's deadline on the wire; a lender that does not answer in time, has no
 * responders or answers something malformed is `unreachable` (the planner backs the region off), one that says
 * it has nothing is `refused`.
 */
import { errors, type NatsConnection } from '@nats-io/nats-core';
import type { LoanAnswer } from '../../core/borrowing/planner.js';
import { DEFAULT_KV_NAMESPACE } from '../../core/wire/kv.js';
import { LoanReply, loanSubject, type LoanRequest } from '../../core/wire/loan.js';
import { loanAnswer } from '../../core/borrowing/lender.js';
import { onTheWire, WireTimeoutError } from '../resilience/wire-timeout.js';
import type { LoanAsker } from './borrower.js';

export function natsLoanAsker(nc: NatsConnection, namespace = DEFAULT_KV_NAMESPACE): LoanAsker {
  return async (lender: string, request: LoanRequest, deadlineAt: number): Promise<LoanAnswer> => {
    const budget = Math.floor(deadlineAt - Date.now());
    if (budget < 1) return { kind: 'late' };
    if (nc.isClosed() || nc.isDraining()) return { kind: 'unreachable' };
    let raw: unknown;
    const sentAt = Date.now();
    try {
      const msg = await onTheWire(
        nc.request(loanSubject(namespace, lender).subject, JSON.stringify(request), {
          timeout: budget * 2 + 100,
        }),
        budget,
        `loan from ${lender}`,
      );
      raw = msg.json();
    } catch (error) {
      // No answer in time says little when the wait was short (the planner judges it by the region's round
      // trip); no responders, a closed connection or any other failure says the region cannot lend now.
      if (error instanceof WireTimeoutError || error instanceof errors.TimeoutError)
        return { kind: 'timeout', waitedMs: Date.now() - sentAt };
      return { kind: 'unreachable' };
    }
    const parsed = LoanReply.safeParse(raw);
    if (!parsed.success) return { kind: 'unreachable' };
    return loanAnswer(parsed.data, Date.now() - sentAt);
  };
}
