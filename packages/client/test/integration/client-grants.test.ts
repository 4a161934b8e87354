/**
 * Local grants against a real agent process and Redis: N clients (each its own grant pool, as N service processes
 * would hold) × M concurrent callers hammer one subject whose bucket holds 100 tokens and barely refills. Grants
 * pre-debit the bucket, so the clients together admit at most 100, and since demand exceeds supply and every
 * unspent rest is spent or handed back, at least 97. A grant taken and never handed back (a crashed process)
 * only takes admissions away. Counter kinds and strict policies never get grants. A return is bound to its take: a
 * forged grant id credits nothing, a second return of one grant credits nothing, an honest rest is credited. A
 * denial repeated in the client carries the headers the agent gives it (draft-11, and draft-10 with legacy ones).
 */
import { describe, expect, it } from 'vitest';
import { AgentClient } from '../../src/index.js';
import { agentProcessOnOwnRedis } from '../../../../test/helpers/agent-process.js';

const CLIENTS = 4;
const CALLERS = 8;
const PER_CALLER = 20;

const POLICIES = {
  // 100 tokens; a refill of one token per 1,000 s adds nothing within a test.
  hot: { capacity: 100, refillPerSecond: 0.001 },
  exact: { kind: 'sliding_log', capacity: 100, windowSeconds: 60 },
};

const own = agentProcessOnOwnRedis({ policies: POLICIES });

/** `clients` × CALLERS callers, each deciding PER_CALLER times back to back; returns admissions per client. */
async function hammer(clients: AgentClient[], policy: string, subject: string): Promise<number[]> {
  const admitted = clients.map(() => 0);
  await Promise.all(
    clients.flatMap((client, c) =>
      Array.from({ length: CALLERS }, async () => {
        for (let i = 0; i < PER_CALLER; i++) {
          // Paced (40 per second per client, 160 in all): the bucket lasts past the first 250 ms window in which a
          // client measures the subject's rate and finds it hot, so grants are taken before supply runs out.
          await new Promise((r) => setTimeout(r, 200));
          const d = await client.decide({ policy, subject });
          if (d.allowed) admitted[c]!++;
        }
      }),
    ),
  );
  return admitted;
}

// A generous timeout: the test counts admissions, and a take whose answer is lost loses its tokens. Grants of
// any size (`minTokens: 1`): a bucket of 100 gets none with the default of 16, and grants are what is tested.
const newClient = () =>
  new AgentClient({ baseUrl: own.agent.url, timeoutMs: 2000, grants: { minTokens: 1 } });
// Grants sized for 5 s of a subject's rate and held that long: handed back when the subject goes cold or expires.
const longClient = () =>
  new AgentClient({ baseUrl: own.agent.url, timeoutMs: 2000, grants: { minTokens: 1, horizonMs: 5000 } });

async function post(path: string, body: object, url = own.agent.url) {
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** What a dry run of one more token says would be left of `subject`'s bucket: its tokens less 1. */
async function left(subject: string): Promise<number> {
  const d = await post('/v1/decisions', { policy: 'hot', subject, dryRun: true });
  return (d.body['results'] as { remaining: number }[])[0]!.remaining;
}

type Item = { status: number; body: Record<string, unknown> };

describe('local grants: exact when demand exceeds supply', () => {
  /** CLIENTS × CALLERS callers on `subject` through `make`'s clients: at most 100 admitted, at least 97. */
  async function exact(make: () => AgentClient, subject: string) {
    const clients = Array.from({ length: CLIENTS }, make);
    const admitted = await hammer(clients, 'hot', subject);
    const total = admitted.reduce((a, b) => a + b, 0);
    const stats = clients.map((c) => c.grantStats()!);
    expect(total).toBeLessThanOrEqual(100);
    expect(total).toBeGreaterThanOrEqual(97);
    // Grants did decide here: some admissions never asked the agent.
    expect(stats.reduce((n, s) => n + s.local, 0)).toBeGreaterThan(0);
    expect(stats.reduce((n, s) => n + s.taken, 0)).toBeGreaterThan(0);
    return { clients, stats };
  }

  it(`${CLIENTS} clients × ${CALLERS} callers on a bucket of 100 admit at most 100 and at least 97`, async () => {
    const { clients, stats } = await exact(newClient, 'tenant-1');
    // Less than one request's worth is held once demand has drained the bucket (a refill's fraction of a token
    // may be granted; it is handed back on expiry).
    expect(stats.reduce((n, s) => n + s.held, 0)).toBeLessThan(1);
    // Once the agent said the subject is out until a token refills, the clients said so too, without asking.
    expect(stats.reduce((n, s) => n + s.denied, 0)).toBeGreaterThan(0);
    const again = await clients[0]!.decide({ policy: 'hot', subject: 'tenant-1' });
    expect(again).toMatchObject({ allowed: false, local: 'grant', results: [{ remaining: 0, limit: 100 }] });
    expect(Number(again.headers['Retry-After'])).toBeGreaterThan(900);
    for (const c of clients) c.close();
  });

  it(`${CLIENTS} clients × ${CALLERS} callers with grants held 5 s: still at most 100 and at least 97`, async () => {
    const { clients } = await exact(longClient, 'tenant-7');
    for (const c of clients) c.close();
  });

  it('a batch of takes never takes more than the bucket holds; its returns credit each grant at most once', async () => {
    const subject = 'tenant-6';
    const takes = Array.from({ length: 15 }, () => ({ policy: 'hot', subject, amount: 10 }));
    const batch = await post('/v1/grants/batch', { takes });
    expect(batch.status).toBe(200);
    const answers = batch.body['takes'] as Item[];
    // A tenth of the bucket a grant: ten grants of 10 empty it, the other five get nothing.
    expect(answers.map((a) => a.body['granted'])).toEqual([...Array<number>(10).fill(10), 0, 0, 0, 0, 0]);
    expect(answers.map((a) => a.body['remaining'])).toEqual([
      90, 80, 70, 60, 50, 40, 30, 20, 10, 0, 0, 0, 0, 0, 0,
    ]);
    const grant = answers[0]!.body['grant'] as string;
    // The same grant handed back twice in one batch, and a forged one: credited once, at most what it took.
    const back = await post('/v1/grants/batch', {
      returns: [
        { policy: 'hot', subject, grant, amount: 6 },
        { policy: 'hot', subject, grant, amount: 6 },
        { policy: 'hot', subject, grant: 'AAAAAAAAAAAAAAAAAAAAAA', amount: 10 },
        { policy: 'hot', subject, grant: answers[1]!.body['grant'], amount: 50 },
      ],
    });
    const returns = back.body['returns'] as Item[];
    expect(returns.map((r) => [r.status, r.body['credited'] ?? r.body['code']])).toEqual([
      [200, 6],
      [404, 'AGT_ERR_UNKNOWN_GRANT'],
      [404, 'AGT_ERR_UNKNOWN_GRANT'],
      [200, 10],
    ]);
    expect(await left(subject)).toBe(15);
    // A malformed batch changes nothing.
    const bad = await post('/v1/grants/batch', {
      takes: [
        { policy: 'hot', subject, amount: 10 },
        { policy: 'hot', subject, amount: 0 },
      ],
    });
    expect(bad).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_GRANT' } });
    expect(await left(subject)).toBe(15);
  });

  it('a grant never handed back (a crashed process) only takes admissions away', async () => {
    // The "crashed" process: it took 10 tokens and will never spend or return them.
    const res = await fetch(`${own.agent.url}/v1/grants`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'hot', subject: 'tenant-2', amount: 10 }),
    });
    expect(await res.json()).toMatchObject({ granted: 10, limit: 100, remaining: 90 });
    const clients = Array.from({ length: CLIENTS }, newClient);
    const admitted = await hammer(clients, 'hot', 'tenant-2');
    for (const c of clients) c.close();
    const total = admitted.reduce((a, b) => a + b, 0);
    expect(total).toBeLessThanOrEqual(90);
    expect(total).toBeGreaterThanOrEqual(87);
  });

  it('a return credits only a grant the agent gave, at most its rest, once (no grant-return mint)', async () => {
    const subject = 'tenant-4';
    const take = await post('/v1/grants', { policy: 'hot', subject, amount: 10 });
    expect(take.body).toMatchObject({ granted: 10, limit: 100, remaining: 90 });
    const grant = take.body['grant'] as string;
    expect(grant).toMatch(/^[A-Za-z0-9_-]{22}$/);
    // Forged: a well-formed id the agent never gave, and the real id named for another subject.
    const forged = await post('/v1/grants/return', {
      policy: 'hot',
      subject,
      grant: 'AAAAAAAAAAAAAAAAAAAAAA',
      amount: 10,
    });
    expect(forged).toMatchObject({ status: 404, body: { code: 'AGT_ERR_UNKNOWN_GRANT' } });
    const elsewhere = await post('/v1/grants/return', {
      policy: 'hot',
      subject: 'tenant-5',
      grant,
      amount: 10,
    });
    expect(elsewhere).toMatchObject({ status: 404, body: { code: 'AGT_ERR_UNKNOWN_GRANT' } });
    // No id, or a malformed one: refused before the store is asked.
    for (const bad of [{}, { grant: 'x' }, { grant: `${grant.slice(1)}!` }]) {
      const r = await post('/v1/grants/return', { policy: 'hot', subject, amount: 10, ...bad });
      expect(r).toMatchObject({ status: 400, body: { code: 'AGT_ERR_INVALID_GRANT' } });
    }
    expect(await left(subject)).toBe(89);
    // Honest: 4 of the 10 spent, the rest of 6 handed back is credited; the same return again credits nothing.
    const honest = await post('/v1/grants/return', { policy: 'hot', subject, grant, amount: 6 });
    expect(honest).toEqual({ status: 200, body: { policy: 'hot', credited: 6, dropped: 0 } });
    const again = await post('/v1/grants/return', { policy: 'hot', subject, grant, amount: 6 });
    expect(again).toMatchObject({ status: 404, body: { code: 'AGT_ERR_UNKNOWN_GRANT' } });
    expect(await left(subject)).toBe(95);
    // More than a grant took is never credited: a grant of 10 handed back as 1,000 credits 10.
    const next = await post('/v1/grants', { policy: 'hot', subject, amount: 10 });
    expect(next.body).toMatchObject({ granted: 10, remaining: 86 });
    const over = await post('/v1/grants/return', {
      policy: 'hot',
      subject,
      grant: next.body['grant'],
      amount: 1000,
    });
    expect(over).toEqual({ status: 200, body: { policy: 'hot', credited: 10, dropped: 990 } });
    expect(await left(subject)).toBe(95);
  });

  it('a counter kind is never granted: every decision goes to the agent, exactly 100 admitted', async () => {
    const clients = Array.from({ length: 2 }, newClient);
    const admitted = await hammer(clients, 'exact', 'tenant-3');
    const stats = clients.map((c) => c.grantStats()!);
    for (const c of clients) c.close();
    expect(admitted.reduce((a, b) => a + b, 0)).toBe(100);
    expect(stats.reduce((n, s) => n + s.local + s.taken, 0)).toBe(0);
  });
});

/**
 * The agent at `url` empties `subject`'s bucket of `hot` (ten grants of 10, never handed back), then denies it
 * through a client twice: the first denial teaches the client the policy is a token bucket, the second is
 * repeated. Returns the agent's second denial (`agent`), the client's repetition of it 300 ms later (`cached`)
 * and the agent's own answer right after that (`now`).
 */
async function repeatedDenial(url: string, subject: string) {
  const takes = Array.from({ length: 10 }, () => ({ policy: 'hot', subject, amount: 10 }));
  expect((await post('/v1/grants/batch', { takes }, url)).status).toBe(200);
  const client = new AgentClient({ baseUrl: url, timeoutMs: 2000 });
  const body = { policy: 'hot', subject };
  try {
    expect(await client.decide(body)).toMatchObject({ allowed: false });
    // The grant route's answer (the policy is a token bucket) arrives.
    await new Promise((r) => setTimeout(r, 200));
    const agent = await client.decide(body);
    await new Promise((r) => setTimeout(r, 300));
    const cached = await client.decide(body);
    const now = await post('/v1/decisions', body, url);
    expect(agent).toMatchObject({ allowed: false });
    expect(agent).not.toHaveProperty('local');
    expect(cached).toMatchObject({ allowed: false, local: 'grant' });
    expect(now.body).toMatchObject({ allowed: false });
    return {
      agent: agent.headers,
      cached: cached.headers,
      now: now.body['headers'] as Record<string, string>,
    };
  } finally {
    client.close();
  }
}

/** The r and t of the `hot` item of a RateLimit header. */
function item(header: string | undefined): { r: number; t: number } {
  const m = /^"hot";r=(\d+);t=(\d+)$/.exec(header ?? '');
  expect(m, `RateLimit: ${header}`).not.toBeNull();
  return { r: Number(m![1]), t: Number(m![2]) };
}

/** The cached denial's headers agree with the agent's, before and after it: same r and q, t within 1 s. */
function sameAsAgent(h: {
  agent: Record<string, string>;
  cached: Record<string, string>;
  now: Record<string, string>;
}) {
  const cached = item(h.cached['RateLimit']);
  for (const said of [h.agent, h.now]) {
    expect(cached.r).toBe(item(said['RateLimit']).r);
    expect(Math.abs(cached.t - item(said['RateLimit']).t)).toBeLessThanOrEqual(1);
    expect(h.cached['RateLimit-Policy']).toBe(said['RateLimit-Policy']);
    expect(Math.abs(Number(h.cached['Retry-After']) - Number(said['Retry-After']))).toBeLessThanOrEqual(1);
  }
  return cached;
}

describe('a denial repeated in the client says what the agent says', () => {
  it('draft-11 (the default): t is the time until the quota is whole again, not the wait', async () => {
    const h = await repeatedDenial(own.agent.url, 'tenant-8');
    const { r, t } = sameAsAgent(h);
    // Empty, refilling 0.001 a second: a token fits in 1,000 s, the quota is whole in 100,000 s.
    expect(r).toBe(0);
    expect(t).toBeGreaterThan(99_000);
    expect(Number(h.cached['Retry-After'])).toBeLessThanOrEqual(1000);
  });

  describe('draft-10 with the legacy headers', () => {
    const ten = agentProcessOnOwnRedis({
      policies: POLICIES,
      env: { QP_RATE_LIMIT_HEADERS: 'draft-10', QP_LEGACY_HEADERS: 'true' },
    });

    it("t is the wait until the cost fits, and the X-RateLimit-* headers are the agent's", async () => {
      const h = await repeatedDenial(ten.agent.url, 'tenant-9');
      const { r, t } = sameAsAgent(h);
      expect(r).toBe(0);
      expect(t).toBe(Number(h.cached['Retry-After']));
      expect(t).toBeLessThanOrEqual(1000);
      for (const said of [h.agent, h.now]) {
        expect(h.cached['X-RateLimit-Limit']).toBe(said['X-RateLimit-Limit']);
        expect(h.cached['X-RateLimit-Remaining']).toBe(said['X-RateLimit-Remaining']);
        expect(
          Math.abs(Number(h.cached['X-RateLimit-Reset']) - Number(said['X-RateLimit-Reset'])),
        ).toBeLessThanOrEqual(1);
      }
    });
  });
});
