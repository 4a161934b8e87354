/**
 * Strict mode across regions on real NATS and Redis: a strict policy's bucket lives in its home region only;
 * agents elsewhere forward over NATS request/reply to the home region's queue group.
 */
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { strictSubject } from '../../../../core/wire/strict.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

describe('strict mode: one bucket in the home region, forwarded to from everywhere', () => {
  let stack: ServiceStack;

  beforeAll(async () => {
    // A generous deadline: under 600 concurrent callers on two cores a 50 ms deadline would fail some forwarded
    // decisions closed, which is the point of another test below, not of this one.
    stack = await startStack({ agent: { decisionDeadlineMs: 5000, storeTimeoutMs: 5000 } });
    // 100 with next to no refill (1 a day): exact counts for the length of the test.
    await stack.putPolicy('payments', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 100,
      refillPerSecond: 100 / 86_400,
    });
    await stack.putPolicy('refunds', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 5,
      refillPerSecond: 5 / 86_400,
    });
    await stack.putPolicy('exports', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 3,
      refillPerSecond: 3 / 86_400,
      maxCost: 3,
    });
    await stack.putPolicy('carts', {
      mode: 'local',
      capacity: 100,
      refillPerSecond: 100 / 86_400,
    });
    await stack.ready(['payments', 'refunds', 'exports', 'carts']);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  it('600 concurrent callers spread over three regions admit exactly 100 in total', async () => {
    const answers = await Promise.all(
      Array.from({ length: 600 }, (_, i) => {
        const agent = stack.agents[i % stack.agents.length]!;
        return decide(agent.url, { policy: 'payments', subject: 'acct-1' });
      }),
    );
    expect(answers.every((a) => a.status === 200)).toBe(true);
    expect(answers.filter((a) => a.body.allowed)).toHaveLength(100);
    // Every denial is the quota's, not a failure mode's: the home bucket holds the whole budget, used up.
    expect(
      answers.filter((a) => !a.body.allowed).every((a) => a.body.results![0]!.reason === 'subject_exhausted'),
    ).toBe(true);
    const byRegion = Object.fromEntries(
      stack.regions.map((r) => [
        r,
        answers.filter((a, i) => a.body.allowed && stack.agents[i % stack.agents.length]!.region === r)
          .length,
      ]),
    );
    expect(Object.values(byRegion).reduce((x, y) => x + y, 0)).toBe(100);
  }, 60_000);

  it('layered strict checks and idempotency keys work the same across the hop', async () => {
    const eu = stack.inRegion('eu')[0]!;
    const body = {
      checks: [
        { policy: 'refunds', subject: 'acct-2' },
        { policy: 'exports', subject: 'acct-2', cost: 3 },
      ],
      idempotencyKey: 'order-77',
    };
    const first = await decide(eu.url, body);
    expect(first.body, JSON.stringify(first.body)).toMatchObject({ allowed: true });
    const retry = await decide(stack.inRegion('ap')[0]!.url, body);
    expect(retry.body).toMatchObject({ allowed: true, replayed: true });
    // exports is now empty: a layered request that needs it denies, and charges refunds nothing.
    const denied = await decide(eu.url, { checks: body.checks });
    expect(denied.body.allowed).toBe(false);
    const probe = await decide(stack.inRegion('us')[0]!.url, {
      policy: 'refunds',
      subject: 'acct-2',
      dryRun: true,
    });
    expect(probe.body.results![0]!.allowed).toBe(true);
    const conflict = await decide(eu.url, { ...body, checks: [{ policy: 'refunds', subject: 'acct-2' }] });
    expect(conflict.status).toBe(409);
    expect(conflict.body.code).toBe('AGT_ERR_IDEMPOTENCY_CONFLICT');
  }, 30_000);

  it('a request of strict and other checks retried through another region charges the strict bucket once', async () => {
    const us = stack.inRegion('us')[0]!;
    const eu = stack.inRegion('eu')[0]!;
    // refunds holds 5 for each subject: each direction below leaves exactly 4 when its retry replays.
    const request = (subject: string, key: string) => ({
      checks: [
        { policy: 'refunds', subject },
        { policy: 'carts', subject },
      ],
      idempotencyKey: key,
    });
    // What the home bucket holds: a dry run answers what would be left after its cost of 1.
    const left = async (subject: string): Promise<number> =>
      remainingOf((await decide(us.url, { policy: 'refunds', subject, dryRun: true })).body) + 1;
    // First at the home, retried at home, then through eu.
    const first = await decide(us.url, request('acct-3', 'order-80'));
    expect(first.body, JSON.stringify(first.body)).toMatchObject({ allowed: true });
    expect(remainingOf(first.body)).toBe(4);
    const again = await decide(us.url, request('acct-3', 'order-80'));
    expect(again.body).toMatchObject({ allowed: true, replayed: true });
    const away = await decide(eu.url, request('acct-3', 'order-80'));
    expect(away.status, JSON.stringify(away.body)).toBe(200);
    // The strict check replays at its home (the local one is decided in eu, which never saw the key: docs/agent.md).
    expect(away.body.allowed).toBe(true);
    expect(remainingOf(away.body)).toBe(4);
    expect(await left('acct-3')).toBe(4);
    // First through eu, retried at the home.
    const viaEu = await decide(eu.url, request('acct-4', 'order-81'));
    expect(viaEu.body, JSON.stringify(viaEu.body)).toMatchObject({ allowed: true });
    const atHome = await decide(us.url, request('acct-4', 'order-81'));
    expect(atHome.status, JSON.stringify(atHome.body)).toBe(200);
    expect(atHome.body.allowed).toBe(true);
    expect(await left('acct-4')).toBe(4);
    // The same key on another request is still a conflict at the home.
    const other = await decide(us.url, {
      ...request('acct-3', 'order-80'),
      checks: [
        { policy: 'refunds', subject: 'acct-3' },
        { policy: 'carts', subject: 'acct-9' },
      ],
    });
    expect(other.status, JSON.stringify(other.body)).toBe(409);
    expect(await left('acct-3')).toBe(4);
  }, 30_000);

  it('a home answers a batch of forwarded decisions one by one, in order, and refuses a malformed batch whole', async () => {
    const nc = await connect({ servers: stack.natsUrl('us') });
    try {
      const { subject } = strictSubject(stack.namespace, 'us');
      const one = (policy: string) => ({
        fromRegion: 'eu',
        checks: [{ policy, subject: 'batch-1', cost: 1 }],
        dryRun: false,
        budgetMs: 5000,
      });
      const ask = async (body: unknown) =>
        (await nc.request(subject, JSON.stringify(body), { timeout: 5000 })).json<{
          replies?: { results?: { allowed: boolean; remaining: number }[]; error?: string }[];
          error?: string;
        }>();
      const batch = await ask({ fromRegion: 'eu', batch: [one('refunds'), one('no-such'), one('refunds')] });
      expect(batch.replies).toHaveLength(3);
      expect(batch.replies![0]!.results).toMatchObject([{ allowed: true, remaining: 4 }]);
      expect(batch.replies![1]!.error).toBe('unknown_policy');
      expect(batch.replies![2]!.results).toMatchObject([{ allowed: true, remaining: 3 }]);
      // Empty, or one decision malformed: the whole batch is refused and nothing is charged.
      expect(await ask({ fromRegion: 'eu', batch: [] })).toMatchObject({ error: 'invalid_request' });
      expect(await ask({ fromRegion: 'eu', batch: [one('refunds'), { checks: 'x' }] })).toMatchObject({
        error: 'invalid_request',
      });
      const probe = await decide(stack.inRegion('us')[0]!.url, {
        policy: 'refunds',
        subject: 'batch-1',
        dryRun: true,
      });
      // 3 left: a dry run answers what would remain after it (2).
      expect(probe.body.results![0]).toMatchObject({ allowed: true, remaining: 2 });
    } finally {
      await nc.close();
    }
  }, 30_000);

  it('with the home agents stopped, other regions fail closed within the deadline and recover by themselves', async () => {
    const home = stack.inRegion('us');
    for (const a of home) await stack.stopAgent(a);
    const eu = stack.inRegion('eu')[0]!;
    const started = Date.now();
    const answer = await decide(eu.url, { policy: 'payments', subject: 'acct-3' });
    const took = Date.now() - started;
    expect(answer.status).toBe(200);
    expect(answer.body.allowed).toBe(false);
    expect(answer.body.results![0]!.reason).toBe('home_unreachable');
    // No responders answers at once; the deadline (5 s here) bounds the worst case.
    expect(took).toBeLessThan(5000 + 500);
    await stack.startAgent('us');
    await stack.ready(['payments']);
    const back = await decide(eu.url, { policy: 'payments', subject: 'acct-3' });
    expect(back.body.allowed).toBe(true);
    expect(back.body.results![0]!.reason).toBeUndefined();
  }, 60_000);
});

/** The first check's `remaining` in a decision's body. */
function remainingOf(body: { results?: object[] }): number {
  return (body.results![0] as { remaining: number }).remaining;
}
