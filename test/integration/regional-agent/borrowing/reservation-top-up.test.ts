/**
 * Reservations and borrowing together, on the real stack (us, eu, ap; equal shares of 60 held still: 20 each).
 * A reservation of 15 on us leaves its bucket at 5, below the low-water mark: a top-up borrowed from eu and ap
 * refilled it. The reservation is then cancelled: its refund of 15 finds the bucket full and was dropped, so the
 * subject had lost 15 of its 60 tokens (45 admitted by a burst afterwards) though it used none.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function call(url: string, method: 'POST' | 'DELETE', body?: object) {
  const res = await fetch(url, {
    method,
    ...(body === undefined
      ? {}
      : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
  });
  return (await res.json()) as Record<string, unknown>;
}

describe('a reservation cancelled while borrowing is on gives everything back', () => {
  let stack: ServiceStack;
  const url = (region: string) => stack.inRegion(region)[0]!.url;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      rebalance: { hysteresis: 0.5 },
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 400, borrowBackoffMs: 2000 },
    });
    await stack.putPolicy('jobs', { capacity: 60, refillPerSecond: 0.0001, minShare: 0.25, maxCost: 15 });
    await stack.ready(['jobs']);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  it('reserve 15 on us, cancel it: a burst then gets the whole 60, not 45', async () => {
    const r = await call(`${url('us')}/v1/reservations`, 'POST', {
      policy: 'jobs',
      subject: 'tenant',
      amount: 15,
    });
    expect(r).toMatchObject({ allowed: true, results: [{ remaining: 5, limit: 20 }] });
    // Long enough for a top-up to have been asked, lent and credited.
    await sleep(1500);
    const id = (r['reservation'] as { id: string }).id;
    expect(await call(`${url('us')}/v1/reservations/${id}`, 'DELETE')).toMatchObject({ refunded: 15 });
    const answers = await Promise.all(
      Array.from({ length: 70 }, () => decide(url('us'), { policy: 'jobs', subject: 'tenant' })),
    );
    expect(answers.filter((a) => a.body.allowed === true).length).toBe(60);
  }, 60_000);
});
