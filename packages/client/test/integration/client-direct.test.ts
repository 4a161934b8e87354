/**
 * Direct decisions against a real agent process and a real redis-server: clients with `direct: { redis }` decide
 * single checks in their own process on the agent's buckets, under the agent's terms. N clients × M callers on
 * one subject whose bucket holds 100 tokens and barely refills admit exactly 100 (every decision, here or at the
 * agent, is one atomic script call on the same bucket). A direct answer says what the agent would say. A Redis
 * that freezes sends the checks to the agent, which answers by its failure mode; a policy the agent gives no
 * terms for is decided at the agent.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { AgentClient } from '../../src/index.js';
import { agentProcessOnOwnRedis } from '../../../../test/helpers/agent-process.js';

const CLIENTS = 4;
const CALLERS = 8;
const PER_CALLER = 20;

const own = agentProcessOnOwnRedis({
  policies: {
    // 100 tokens; a refill of one token per 1,000 s adds nothing within a test.
    hot: { capacity: 100, refillPerSecond: 0.001 },
    // Two tokens, one every 50 ms: a refusal's retry-after is short enough to wait out.
    quick: { capacity: 2, refillPerSecond: 20 },
    exact: { kind: 'sliding_log', capacity: 100, windowSeconds: 60 },
  },
  // Terms are off unless the operator turns them on for services trusted with the region's Redis.
  env: { QP_TERMS: 'on' },
});

const SECRET = 'an-hmac-secret-of-the-region-1';
// An agent that keys subjects with an HMAC secret, as `npm start` runs them.
const hashing = agentProcessOnOwnRedis({
  policies: { hot: { capacity: 100, refillPerSecond: 0.001 } },
  env: { QP_TERMS: 'on', QP_HMAC_SECRET: SECRET },
});

const opened: { client: AgentClient; redis: Redis }[] = [];
afterEach(() => {
  for (const { client, redis } of opened.splice(0)) {
    client.close();
    redis.disconnect();
  }
});

function directClient(at = own, hmacSecret?: string, grants?: false): AgentClient {
  const redis = new Redis(at.redis.url, { maxRetriesPerRequest: 1 });
  const client = new AgentClient({
    baseUrl: at.agent.url,
    timeoutMs: 2000,
    direct: {
      redis,
      ...(hmacSecret === undefined ? {} : { hmacSecret }),
      ...(grants === undefined ? {} : { grants }),
    },
  });
  opened.push({ client, redis });
  return client;
}

/** Until `client` holds a term for `policy` (its first check asks for one), at most 5 s. */
async function termFor(client: AgentClient, policy: string, subject = 'warm-up'): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const d = await client.decide({ policy, subject });
    if ('local' in d && d.local === 'direct') return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no term for ${policy} in 5 s`);
}

describe('direct decisions', () => {
  it(`${CLIENTS} clients × ${CALLERS} callers on a bucket of 100 admit exactly 100; the rest are truthful 429s`, async () => {
    // No tokens taken ahead: every check is a script call on the bucket (the next test takes them).
    const clients = Array.from({ length: CLIENTS }, () => directClient(own, undefined, false));
    await Promise.all(clients.map((c) => termFor(c, 'hot')));
    const decidedHere = () =>
      clients.reduce((n, c) => n + c.directStats()!.admitted + c.directStats()!.refused, 0);
    const warm = decidedHere();
    const agentDecided = clients.reduce((n, c) => n + c.stats().decided, 0);
    const answers = await Promise.all(
      clients.flatMap((client) =>
        Array.from({ length: CALLERS }, async () => {
          const out = [];
          for (let i = 0; i < PER_CALLER; i++)
            out.push(await client.decide({ policy: 'hot', subject: 'tenant-1' }));
          return out;
        }),
      ),
    );
    const all = answers.flat();
    expect(all).toHaveLength(CLIENTS * CALLERS * PER_CALLER);
    expect(all.filter((d) => d.allowed)).toHaveLength(100);
    const refused = all.filter((d) => !d.allowed);
    expect(
      refused.every((d) => d.degraded === undefined && d.results[0]!.reason === 'subject_exhausted'),
    ).toBe(true);
    expect(refused.every((d) => Number(d.headers['Retry-After']) > 900)).toBe(true);
    // Decided in the clients: no decision of this subject asked the agent.
    expect(decidedHere() - warm).toBe(CLIENTS * CALLERS * PER_CALLER);
    expect(clients.reduce((n, c) => n + c.stats().decided, 0)).toBe(agentDecided);
    // The agent decides on the same bucket: empty.
    const res = await fetch(`${own.agent.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'hot', subject: 'tenant-1' }),
    });
    const body = (await res.json()) as { allowed: boolean; results: { remaining: number }[] };
    expect(body).toMatchObject({ allowed: false, results: [{ remaining: 0 }] });
  });

  it(`${CLIENTS} clients × ${CALLERS} callers taking tokens ahead admit at most 100 and at least 97, and say what they hold`, async () => {
    const clients = Array.from({ length: CLIENTS }, () => directClient());
    await Promise.all(clients.map((c) => termFor(c, 'hot')));
    const answers = await Promise.all(
      clients.flatMap((client) =>
        Array.from({ length: CALLERS }, async () => {
          const out = [];
          for (let i = 0; i < PER_CALLER; i++)
            out.push(await client.decide({ policy: 'hot', subject: 'tenant-2' }));
          return out;
        }),
      ),
    );
    const all = answers.flat();
    const admitted = all.filter((d) => d.allowed);
    expect(admitted.length).toBeLessThanOrEqual(100);
    expect(admitted.length).toBeGreaterThanOrEqual(97);
    expect(all.filter((d) => !d.allowed).every((d) => d.results[0]!.reason === 'subject_exhausted')).toBe(
      true,
    );
    // Tokens were taken ahead and spent with no call.
    const grants = clients.map((c) => c.directStats()!.grants);
    const sum = (f: (g: (typeof grants)[number]) => number) => grants.reduce((n, g) => n + f(g), 0);
    expect(sum((g) => g.taken)).toBeGreaterThan(0);
    expect(sum((g) => g.spent)).toBeGreaterThan(0);
    // What the bucket gave: the script's admissions and the tokens taken ahead, never more than it held.
    const scripted = admitted.length - sum((g) => g.spent);
    expect(scripted + sum((g) => g.tokens)).toBeLessThanOrEqual(100);
    // A caller admitted on a held token is told what sequential checks would be: remaining never grows past 99.
    expect(admitted.every((d) => (d.results[0]!.remaining ?? 100) <= 99)).toBe(true);
    const res = await fetch(`${own.agent.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'hot', subject: 'tenant-2' }),
    });
    expect(((await res.json()) as { allowed: boolean }).allowed).toBe(false);
  });

  it('tokens taken ahead and not spent go back to the bucket on close: it then holds exactly 100 less what was admitted', async () => {
    const client = directClient();
    await termFor(client, 'hot');
    let admitted = 0;
    // A steady pace (a check every 5 ms): the second check on takes ahead, later ones spend with no call.
    for (let i = 0; i < 30; i++) {
      if ((await client.decide({ policy: 'hot', subject: 'tenant-3' })).allowed) admitted++;
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(admitted).toBe(30);
    const before = client.directStats()!.grants;
    expect(before.taken).toBeGreaterThan(0);
    expect(before.spent).toBeGreaterThan(0);
    const held = before.tokens - before.spent - before.returned - before.dropped;
    expect(held).toBeGreaterThan(0);
    // Handed back as the client closes; closeAndDrain settles once Redis answered.
    await client.closeAndDrain();
    const after = client.directStats()!.grants;
    expect(after).toMatchObject({ returned: before.returned + held, dropped: 0, returnsFailed: 0 });
    const redis = new Redis(own.redis.url);
    try {
      const [key, ...others] = await redis.keys('rl:v*:{tenant-3}:hot');
      expect(others).toEqual([]);
      // Stored micro-tokens; the refill (a thousandth of a token a second) adds less than one in this test.
      expect(Math.floor(Number(await redis.hget(key!, 'tk')) / 1e6)).toBe(100 - admitted);
    } finally {
      redis.disconnect();
    }
  });

  it('a take the bucket is short of (another process spent it) charges nothing; the check goes again alone', async () => {
    const taker = directClient();
    const drain = directClient(own, undefined, false);
    await Promise.all([termFor(taker, 'hot'), termFor(drain, 'hot')]);
    const subject = { policy: 'hot', subject: 'tenant-5' };
    // Two checks 5 ms apart: the second takes 10 ahead in its own request (cost 11), leaving 88.
    for (let i = 0; i < 2; i++) {
      expect((await taker.decide(subject)).allowed).toBe(true);
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(taker.directStats()!.grants).toMatchObject({ taken: 1, tokens: 10 });
    // Another process (taking nothing ahead) spends all but 3.
    let drained = 0;
    for (let i = 0; i < 120 && drained < 85; i++) if ((await drain.decide(subject)).allowed) drained++;
    expect(drained).toBe(85);
    // The taker spends its 10 here, then asks for its check and another 10 together, which the 3 left cannot pay:
    // nothing is charged, and the check goes again alone, admitted on one of the 3.
    let admitted = 0;
    for (let i = 0; i < 20 && taker.directStats()!.grants.short === 0; i++) {
      if ((await taker.decide(subject)).allowed) admitted++;
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(admitted).toBe(11);
    expect(taker.directStats()!.grants).toMatchObject({ taken: 1, tokens: 10, spent: 10, short: 1 });
    const redis = new Redis(own.redis.url);
    try {
      const [key] = await redis.keys('rl:v*:{tenant-5}:hot');
      // Every admission paid exactly once: 100 less the 2 + 85 + 11 admitted.
      expect(Math.floor(Number(await redis.hget(key!, 'tk')) / 1e6)).toBe(100 - 2 - drained - admitted);
    } finally {
      redis.disconnect();
    }
  });

  it('a refusal is remembered until its retry-after, and a caller that waits the retry-after it is told is admitted', async () => {
    const client = directClient();
    await termFor(client, 'quick');
    const subject = { policy: 'quick', subject: 'waits' };
    const statuses: string[] = [];
    for (let round = 0; round < 6; round++) {
      // Drain what refilled, then ask until refused.
      let d = await client.decide(subject);
      while (d.allowed) d = await client.decide(subject);
      const calls = client.directStats()!.calls;
      // Asked again at once: refused from memory, no script call, told at most what the script said.
      const again = await client.decide(subject);
      expect(again).toMatchObject({ allowed: false, local: 'direct' });
      expect(client.directStats()!.calls).toBe(calls);
      expect(again.retryAfterMs).toBeGreaterThan(0);
      expect(again.retryAfterMs).toBeLessThanOrEqual(d.retryAfterMs!);
      await new Promise((r) => setTimeout(r, again.retryAfterMs!));
      const after = await client.decide(subject);
      statuses.push(
        `${after.allowed ? 'admitted' : 'refused'} ${'local' in after ? String(after.local) : 'agent'}`,
      );
    }
    expect(statuses).toEqual(Array(6).fill('admitted direct'));
    expect(client.directStats()!.recalled).toBeGreaterThanOrEqual(6);
  });

  it('a direct answer says what the agent says: the same result and headers for the same bucket', async () => {
    const client = directClient();
    await termFor(client, 'hot');
    const viaAgent = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 2000, grants: false });
    try {
      const a = await viaAgent.decide({ policy: 'hot', subject: 'same-a' });
      const d = await client.decide({ policy: 'hot', subject: 'same-d' });
      expect(d).toMatchObject({ local: 'direct' });
      const { local: _, ...direct } = d as typeof d & { local: string };
      expect(direct).toEqual(a);
      expect(d.headers['RateLimit']).toMatch(/^"hot";r=99;t=\d+$/);
    } finally {
      viaAgent.close();
    }
  });

  it('an agent that hashes subjects: the same secret decides on its buckets, another decides nothing here', async () => {
    // No tokens taken ahead: each check here is a script call, so the counts interleave with the agent's.
    const client = directClient(hashing, SECRET, false);
    await termFor(client, 'hot');
    const viaAgent = new AgentClient({ baseUrl: hashing.agent.url, timeoutMs: 2000, grants: false });
    const wrong = directClient(hashing, 'another-secret-of-16-chars');
    try {
      // One subject, alternately here and at the agent: one bucket, counting down by one each time.
      const seen: number[] = [];
      for (let i = 0; i < 3; i++) {
        const d = await client.decide({ policy: 'hot', subject: 'user@example.com' });
        expect(d).toMatchObject({ allowed: true, local: 'direct' });
        const a = await viaAgent.decide({ policy: 'hot', subject: 'user@example.com' });
        seen.push(d.results[0]!.remaining!, a.results[0]!.remaining!);
      }
      expect(seen).toEqual([99, 98, 97, 96, 95, 94]);
      for (let i = 0; i < 3; i++) {
        const d = await wrong.decide({ policy: 'hot', subject: 'user@example.com' });
        expect('local' in d).toBe(false);
        await new Promise((r) => setTimeout(r, 30));
      }
      expect(wrong.directStats()!.terms).toMatchObject({ taken: 0, notAllowed: 1 });
    } finally {
      viaAgent.close();
    }
  });

  it('a frozen Redis sends the checks to the agent, which answers by its failure mode; direct decisions come back after', async () => {
    const client = directClient();
    await termFor(client, 'hot');
    await own.redis.pause();
    let answers;
    try {
      answers = await Promise.all(
        Array.from({ length: 20 }, (_, i) => client.decide({ policy: 'hot', subject: `frozen-${i}` })),
      );
    } finally {
      await own.redis.resume();
    }
    // Nothing was admitted on a call Redis never answered: every answer is the agent's failure-mode refusal.
    expect(answers.filter((d) => d.allowed)).toHaveLength(0);
    expect(answers.every((d) => !('local' in d))).toBe(true);
    expect(client.directStats()!.callsFailed).toBeGreaterThanOrEqual(1);
    await new Promise((r) => setTimeout(r, 1100));
    await termFor(client, 'hot', 'thawed');
    const after = await client.decide({ policy: 'hot', subject: 'thawed-2' });
    expect(after).toMatchObject({ allowed: true, local: 'direct' });
  });

  it('a policy the agent gives no terms for (a sliding log) is decided at the agent', async () => {
    const client = directClient();
    for (let i = 0; i < 5; i++) {
      const d = await client.decide({ policy: 'exact', subject: 'log-1' });
      expect(d.allowed).toBe(true);
      expect('local' in d).toBe(false);
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(client.directStats()!.terms).toMatchObject({ taken: 0, notAllowed: 1 });
  });
});
