/**
 * Loans with a stolen agent credential, on the real stack behind the NATS server configuration it generates
 * (nkeys, per-role permissions): three regions, one agent each, equal shares held still. The thief holds region
 * eu's second credential (no running agent uses it).
 *
 * - It answers eu's loan requests itself, granting whatever is asked without taking anything: the borrower
 *   believes a grant only up to what eu's share of the subject could have held (C/3 + R/3·t), so a subject's
 *   admissions stay within C + C/3 however long the forgery goes on (without the check they grow without end).
 * - It floods us with lend requests for hundreds of subjects, naming any region: us lends each requesting region
 *   at most its lend budget per policy, and refuses names that are no region of the subject.
 * - It names made-up origin regions: refused before anything else, counted as `from="other"`, never a label.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_LEND_BUDGET_SUBJECTS } from '../../../../core/borrowing/loan-bounds.js';
import { LoanReply, loanSubject, type LoanRequest } from '../../../../core/wire/loan.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

const C = 60;

describe('loans with a stolen agent credential (real NATS with auth, real agents)', () => {
  let stack: ServiceStack;
  let thief: NatsConnection;
  const url = (region: string) => stack.inRegion(region)[0]!.url;
  const versionOf = (policy: string) =>
    stack.inRegion('us')[0]!.running.coordination!.policies.current().get(policy)!.version;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      secure: { tls: false },
      rebalance: { hysteresis: 0.5 },
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 400, borrowBackoffMs: 200 },
    });
    await stack.putPolicy('minted', { capacity: C, refillPerSecond: 0.0001, minShare: 0.25 });
    await stack.putPolicy('flood', { capacity: C, refillPerSecond: 0.0001, minShare: 0.25 });
    await stack.ready(['minted', 'flood']);
    thief = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-eu-2'),
      maxReconnectAttempts: 0,
    });
  }, 60_000);

  afterAll(async () => {
    await thief?.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('grants eu never debited are believed only up to eu’s share: 300 requests on us admit at most C + C/3', async () => {
    let forged = 0;
    // Outside the queue group: it hears every loan request to eu and answers at once, granting all asked.
    const sub = thief.subscribe(loanSubject(stack.namespace, 'eu').subject, {
      callback: (_e, msg) => {
        const request = msg.json<LoanRequest>();
        if (request.subject !== 'mint-target') return;
        forged++;
        msg.respond(JSON.stringify({ grantedMicros: request.amountMicros, remainingMicros: 0, refillMs: 0 }));
      },
    });
    await thief.flush();
    try {
      let admitted = 0;
      for (let i = 0; i < 30; i++) {
        const answers = await Promise.all(
          Array.from({ length: 10 }, () => decide(url('us'), { policy: 'minted', subject: 'mint-target' })),
        );
        admitted += answers.filter((a) => a.body.allowed === true).length;
      }
      expect(forged).toBeGreaterThan(0);
      // us's own C/3, what ap and eu really hold (C/3 each), and at most eu's share once more (the forgery).
      expect(admitted).toBeLessThanOrEqual(C + C / 3);
      // The thief races eu's real lender for each answer; when one of its grants was believed (more than the
      // real C admitted), us counted it as distrusted. On a busy machine the real lender may win every race.
      const text = await (await fetch(`${url('us')}/metrics`)).text();
      const distrusted = /quotaplane_loan_grants_distrusted_total\{lender="eu",problem="over_bound"\} [1-9]/;
      if (admitted > C) expect(text).toMatch(distrusted);
    } finally {
      sub.unsubscribe();
    }
  });

  it('a flood of lend requests for 300 subjects takes at most the lend budget per requesting region', async () => {
    const version = versionOf('flood');
    const ask = async (fromRegion: string, subject: string): Promise<LoanReply> => {
      const request: LoanRequest = {
        fromRegion,
        policy: 'flood',
        version,
        subject,
        mode: 'fill',
        amountMicros: C * 1e6,
        budgetMs: 5000,
        deadlineAtMs: Date.now() + 5000,
      };
      const msg = await thief.request(loanSubject(stack.namespace, 'us').subject, JSON.stringify(request), {
        timeout: 5000,
      });
      return LoanReply.parse(msg.json());
    };
    let taken = 0;
    const refusals = new Map<string, number>();
    for (const from of ['eu', 'ap', 'us', 'zz']) {
      for (let batch = 0; batch < 15; batch++) {
        const replies = await Promise.all(
          Array.from({ length: 20 }, (_, i) => ask(from, `flooded-${batch * 20 + i}`)),
        );
        for (const r of replies) {
          if ('error' in r) refusals.set(r.error, (refusals.get(r.error) ?? 0) + 1);
          else taken += r.grantedMicros / 1e6;
        }
      }
    }
    // Without a budget: every one of the 300 subjects’ buckets on us, C/3 each = 6,000 tokens. With one: 16 bursts of C
    // per requesting region; us itself and a made-up region get nothing.
    const budget = DEFAULT_LEND_BUDGET_SUBJECTS * C;
    expect(taken).toBeGreaterThan(0);
    expect(taken).toBeLessThanOrEqual(2 * budget + 1);
    expect(refusals.get('invalid_request')).toBe(600);
    expect(refusals.get('overloaded') ?? 0).toBeGreaterThan(0);
    // A subject nobody flooded is untouched: us admits its whole share at home.
    const home = await Promise.all(
      Array.from({ length: C / 3 }, () => decide(url('us'), { policy: 'flood', subject: 'bystander' })),
    );
    expect(home.filter((a) => a.body.allowed === true)).toHaveLength(C / 3);
  });

  it('a lend request from a region no record names is refused first; its name never becomes a label', async () => {
    const served = async (): Promise<string> => {
      const text = await (await fetch(`${url('us')}/metrics`)).text();
      return text
        .split('\n')
        .filter((l) => l.startsWith('quotaplane_loans_served_total{'))
        .join('\n');
    };
    const counted = (text: string) =>
      Number(/\{from="other",outcome="unknown_region"\} (\d+)/.exec(text)?.[1] ?? 0);
    const before = counted(await served());
    const version = versionOf('flood');
    // 40 made-up origins: half for a real policy, half for one that does not exist (which used to be counted
    // under the made-up origin, as an unknown policy, before the origin was checked).
    const replies = await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        const request: LoanRequest = {
          fromRegion: `made-up-${i}`,
          policy: i % 2 === 0 ? 'flood' : 'no-such-policy',
          version,
          subject: `stray-${i}`,
          mode: 'fill',
          amountMicros: 1e6,
          budgetMs: 5000,
          deadlineAtMs: Date.now() + 5000,
        };
        const msg = await thief.request(loanSubject(stack.namespace, 'us').subject, JSON.stringify(request), {
          timeout: 5000,
        });
        return LoanReply.parse(msg.json());
      }),
    );
    expect(replies.map((r) => ('error' in r ? r.error : 'granted'))).toEqual(
      Array(40).fill('invalid_request'),
    );
    const after = await served();
    expect(counted(after) - before).toBe(40);
    expect(after).not.toMatch(/made-up/);
    // The known regions still lend: their series are the configured names.
    expect(after).toMatch(/from="eu"/);
  });
});
