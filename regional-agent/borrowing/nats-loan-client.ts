/**
 * Loan requests over NATS: request/reply to the lender region's queue group (one of its agents answers). Every
 * wait is bounded by the borrower's deadline on the wire; a lender that does not answer in time, has no
 * responders or answers something malformed is `unreachable` (the planner backs the region off), one that says
 * it has nothing is `refused`.
 */
import { errors, type NatsConnection } from '@nats-io/nats-core';
import type { LoanAnswer } from '../../core/borrowing/planner.js';
import { DEFAULT_KV_NAMESPACE } from '../../core/wire/kv.js';
import { LoanReply, loanSubject } from '../../core/wire/loan.js';
import { loanAnswer } from '../../core/borrowing/lender.js';
import { onTheWire, WireTimeoutError } from '../resilience/wire-timeout.js';
import type { LoanAsker } from './borrower.js';

export function natsLoanAsker(nc: NatsConnection, namespace = DEFAULT_KV_NAMESPACE): LoanAsker {
  return async (lender, request, deadlineAt, late): Promise<LoanAnswer> => {
    const budget = Math.floor(deadlineAt - Date.now());
    if (budget < 1) return { kind: 'late' };
    if (nc.isClosed() || nc.isDraining()) return { kind: 'unreachable' };
    let raw: unknown;
    const sentAt = Date.now();
    // The request itself waits twice the borrower's budget: a reply after the budget is still read, and a grant
    // in it handed to `late` (the lender took the tokens; crediting them beats losing them).
    const reply = nc.request(loanSubject(namespace, lender).subject, JSON.stringify(request), {
      timeout: budget * 2 + 100,
    });
    try {
      raw = (await onTheWire(reply, budget, `loan from ${lender}`)).json();
    } catch (error) {
      // No answer in time says little when the wait was short (the planner judges it by the region's round
      // trip); no responders, a closed connection or any other failure says the region cannot lend now.
      if (error instanceof WireTimeoutError) {
        if (late !== undefined)
          reply.then(
            (msg) => {
              let body: unknown;
              try {
                body = msg.json();
              } catch {
                return;
              }
              const answer = answerOf(body, Date.now() - sentAt);
              if (answer.kind === 'grant') late(answer);
            },
            () => undefined,
          );
        return { kind: 'timeout', waitedMs: Date.now() - sentAt };
      }
      if (error instanceof errors.TimeoutError) return { kind: 'timeout', waitedMs: Date.now() - sentAt };
      return { kind: 'unreachable' };
    }
    return answerOf(raw, Date.now() - sentAt);
  };
}

/** A lender's reply as the planner learns from it; a malformed one is `unreachable`. */
function answerOf(raw: unknown, rttMs: number): LoanAnswer {
  const parsed = LoanReply.safeParse(raw);
  if (!parsed.success) return { kind: 'unreachable' };
  return loanAnswer(parsed.data, rttMs);
}
