/**
 * A lease token is never handed out twice, so a retried release (a client repeating `DELETE /v1/leases/{token}`
 * after a timeout) never frees another holder's slot. Through the agent's HTTP API on a real Redis.
 *
 * Redis's clock cannot be stepped back, so each test first writes, straight into the log key, an entry stamped
 * 60 s ahead of Redis time, as a primary whose clock was ahead would have (then a failover to a replica whose
 * clock is behind): every acquire after it is stamped at that entry's stamp, as after a clock step back. That entry
 * holds one slot for the whole test, so the policy has three: the seeded holder, A and B (or C).
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { entryMember, slidingLogKey } from '../../../core/models/sliding-log.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';
import { agentOnRedis } from '../../helpers/agent-fixture.js';

const policies = [parsePolicy({ name: 'jobs', kind: 'concurrency', capacity: 3, leaseSeconds: 600 })];

const redis: Redis = sharedRedis();
let agent: AgentApp;

beforeAll(async () => {
  agent = agentOnRedis(redis, policies);
  await agent.ready;
});
afterAll(async () => {
  await agent.app.close();
  redis.disconnect();
});

async function acquire(subject: string): Promise<{ allowed: boolean; lease: string | undefined }> {
  const res = await agent.app.inject({
    method: 'POST',
    url: '/v1/decisions',
    payload: { policy: 'jobs', subject },
  });
  expect(res.statusCode, res.body).toBe(200);
  const d = DecisionResponse.parse(res.json());
  return { allowed: d.allowed, lease: d.results[0]!.lease };
}

async function release(lease: string): Promise<Record<string, unknown>> {
  const res = await agent.app.inject({ method: 'DELETE', url: `/v1/leases/${encodeURIComponent(lease)}` });
  expect(res.statusCode, res.body).toBe(200);
  return res.json<Record<string, unknown>>();
}

/** A log whose newest entry is stamped 60 s ahead of Redis time: its subject. */
async function aheadOfTheClock(label: string): Promise<{ subject: string; key: string }> {
  const subject = uniquePrefix(label);
  const key = slidingLogKey(1, subject, 'jobs');
  const [seconds, micros] = await redis.time();
  const ahead = Number(seconds) * 1_000_000 + Number(micros) + 60_000_000;
  await redis.zadd(key, ahead, entryMember(ahead, 0));
  await redis.pexpire(key, 600_000);
  return { subject, key };
}

/** Entries of the log (every member above score -inf). */
const held = (key: string) => redis.zcount(key, '(-inf', '+inf');

describe('lease tokens with Redis time behind the newest stamp', () => {
  it('a release retried after the slot was taken again answers released:false and frees nothing', async () => {
    const { subject, key } = await aheadOfTheClock('reuse');
    const a = await acquire(subject);
    const b = await acquire(subject);
    expect([a.allowed, b.allowed]).toEqual([true, true]);
    expect(await release(b.lease!)).toEqual({ policy: 'jobs', released: true, slots: 1 });
    const c = await acquire(subject);
    expect(c.allowed).toBe(true);
    // Stamped on the same instant as b, c still gets entries (and so a token) of its own.
    expect(c.lease).not.toBe(b.lease);
    // b's client retries its release (its first answer timed out): nothing of c's goes.
    expect(await release(b.lease!)).toEqual({ policy: 'jobs', released: false, slots: 0 });
    expect(await held(key)).toBe(3);
    // The seeded holder, a and c hold every slot.
    const d = await acquire(subject);
    expect(d.allowed).toBe(false);
    expect(d.lease).toBeUndefined();
  });

  it('once every lease is released, the next ones still get new tokens; old tokens free nothing', async () => {
    const { subject, key } = await aheadOfTheClock('drained');
    const first = [await acquire(subject), await acquire(subject)];
    for (const l of first) expect(await release(l.lease!)).toMatchObject({ released: true });
    expect(await held(key)).toBe(1);
    const next = [await acquire(subject), await acquire(subject)];
    expect(next.every((l) => l.allowed)).toBe(true);
    const tokens = new Set([...first, ...next].map((l) => l.lease));
    expect(tokens.size).toBe(4);
    for (const l of first) expect(await release(l.lease!)).toMatchObject({ released: false, slots: 0 });
    expect(await held(key)).toBe(3);
    expect((await acquire(subject)).allowed).toBe(false);
  });
});
