/**
 * The NATS loan asker (regional-agent/borrowing/nats-loan-client.ts) with a lender whose reply crosses the link
 * after the borrower's wait: the ask resolves `timeout` at the deadline, and the grant, when it comes, is handed
 * to `late` (the borrower credits it: the lender took those tokens). A late refusal is not.
 */
import { connect } from '@nats-io/transport-node';
import { describe, expect, inject, it } from 'vitest';
import type { LoanAnswer } from '../../../../core/borrowing/planner.js';
import { loanSubject, type LoanReply, type LoanRequest } from '../../../../core/wire/loan.js';
import { natsLoanAsker } from '../../../../regional-agent/borrowing/nats-loan-client.js';
import { uniqueNamespace } from '../../../helpers/coordinator-fixture.js';
import { eventually } from '../../../helpers/wait.js';

const request: LoanRequest = {
  fromRegion: 'us',
  policy: 'api',
  version: 1,
  subject: 'alice',
  mode: 'fill',
  amountMicros: 5_000_000,
  budgetMs: 100,
  deadlineAtMs: Date.now() + 100,
};

describe('natsLoanAsker: a reply after the wait', { timeout: 20_000 }, () => {
  it.each([
    ['a grant is handed to late', { grantedMicros: 3_000_000, remainingMicros: 0, refillMs: 1000 }, 1],
    ['a refusal is not', { error: 'no_share', message: 'none' }, 0],
  ] as [string, LoanReply, number][])('%s', async (_name, reply, lateCount) => {
    const namespace = uniqueNamespace();
    const nc = await connect({ servers: inject('nats').url });
    try {
      // The lender answers 120 ms after the request: 70 ms after the borrower stopped waiting, inside the twice
      // the wait (and 100 ms) that the request itself stays open.
      nc.subscribe(loanSubject(namespace, 'eu').subject, {
        callback: (_error, msg) => {
          setTimeout(() => msg.respond(JSON.stringify(reply)), 120);
        },
      });
      await nc.flush();
      const late: LoanAnswer[] = [];
      const answer = await natsLoanAsker(nc, namespace)('eu', request, Date.now() + 50, (a) => late.push(a));
      expect(answer.kind).toBe('timeout');
      expect(late).toEqual([]);
      if (lateCount === 0) {
        await new Promise((resolve) => setTimeout(resolve, 400));
        expect(late).toEqual([]);
        return;
      }
      await eventually(() => late.length === 1, 2000, 'the late grant');
      expect(late[0]).toMatchObject({ kind: 'grant', grant: reply });
    } finally {
      await nc.close();
    }
  });
});
