import { afterEach, describe, expect, it, vi } from 'vitest';
import type { CheckResult } from '../../../../core/wire/agent.js';
import {
  RATE_LIMIT_DRAFTS,
  rateLimitHeaders,
  type RateLimitDraft,
} from '../../../../core/wire/rate-limit-headers.js';
import type { ClientCheckResult, Decision } from '../../src/agent-client.js';
import { DENIAL_RECHECK_MS, GrantPool, type GrantTransport } from '../../src/grants.js';

const allowed: Decision = {
  allowed: true,
  retryAfterMs: 0,
  results: [{ policy: 'p', allowed: true, remaining: 50, limit: 100, resetMs: 0, retryAfterMs: 0 }],
  headers: { 'RateLimit-Policy': '"p";q=100;w=60' },
};

/** A grant id as the agent draws them (22 base64url characters), for take number `n`. */
const idOf = (n: number) => `g${n}`.padEnd(22, '_');

type Answer = Awaited<ReturnType<GrantTransport>>;

/**
 * The agent's `POST /v1/grants/batch` over a handler of the single routes: returns first, then takes, each
 * answered on its own. `exchanges` records every exchange's body.
 */
function batched(single: (path: string, body: object) => Answer) {
  const exchanges: { takes?: object[]; returns?: object[] }[] = [];
  const send: GrantTransport = (path, body) => {
    if (path !== '/v1/grants/batch') return Promise.resolve(single(path, body));
    const b = body as { takes?: object[]; returns?: object[] };
    exchanges.push(b);
    const item = (a: Answer) => ({ status: a.status, body: a.json });
    const returns = (b.returns ?? []).map((r) => item(single('/v1/grants/return', r)));
    const takes = (b.takes ?? []).map((t) => item(single('/v1/grants', t)));
    return Promise.resolve({ status: 200, json: { takes, returns } });
  };
  return { send, exchanges };
}

/**
 * A transport that grants what is asked (up to `stock`) and records every take and return. Like the agent, it
 * binds a return to its grant: at most what that grant took is credited, once; an unknown id answers 404.
 */
function agent(stock: number, code?: string, maxCost?: number) {
  const calls: { path: string; body: Record<string, unknown> }[] = [];
  const records = new Map<string, number>();
  const single = (path: string, body: object): Answer => {
    calls.push({ path, body: body as Record<string, unknown> });
    if (code !== undefined) return { status: 400, json: { code }, code };
    if (path === '/v1/grants') {
      const granted = Math.min(stock, (body as { amount: number }).amount);
      stock -= granted;
      const grant = granted > 0 ? idOf(records.size + calls.length) : null;
      if (grant !== null) records.set(grant, granted);
      return {
        status: 200,
        json: {
          policy: 'p',
          granted,
          limit: 100,
          remaining: stock,
          refillMs: 0,
          expiresInMs: 1000,
          grant,
          ...(maxCost === undefined ? {} : { maxCost }),
        },
      };
    }
    const { grant, amount } = body as { grant: string; amount: number };
    const recorded = records.get(grant);
    if (recorded === undefined) {
      const unknown = 'AGT_ERR_UNKNOWN_GRANT';
      return { status: 404, json: { code: unknown }, code: unknown };
    }
    records.delete(grant);
    const credited = Math.min(amount, recorded);
    stock += credited;
    return { status: 200, json: { policy: 'p', credited, dropped: amount - credited } };
  };
  const { send, exchanges } = batched(single);
  return { send, calls, exchanges, stock: () => stock };
}

let clock = 1_750_000_000_000;
const now = () => clock;

/**
 * The agent's answer denying one check (`result`), with the headers the agent would send for it
 * (core/wire/rate-limit-headers.ts), under `draft`; `legacy` adds the X-RateLimit-* ones.
 */
function agentDenial(
  result: Omit<ClientCheckResult, 'allowed'>,
  windowSeconds: number,
  draft: RateLimitDraft = 'draft-11',
  legacy = false,
): Decision {
  const full: CheckResult = {
    mode: 'regional',
    remaining: 0,
    limit: 0,
    ...result,
    allowed: false,
  };
  const headers = rateLimitHeaders(false, [{ result: full, windowSeconds, violated: true }], legacy, draft);
  return {
    allowed: false,
    retryAfterMs: result.retryAfterMs,
    results: [{ ...result, allowed: false }],
    headers,
  };
}

/** `n` checks of one subject 300 ms apart (a whole rate window each), observed as admissions when not local. */
function run(pool: GrantPool, n: number, body = { policy: 'p', subject: 's' }) {
  let local = 0;
  for (let i = 0; i < n; i++) {
    clock += 300;
    const d = pool.trySpend(body);
    if (d === undefined) pool.observe(body, allowed);
    else local++;
  }
  return local;
}

/** Past the pool's end-of-turn flush and its exchange's answer. */
const flush = () => new Promise((r) => setTimeout(() => setImmediate(r), 0));

describe('GrantPool', () => {
  it('a cold subject is never granted', () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { hotPerSecond: 1e9 }, now);
    expect(run(pool, 50)).toBe(0);
    expect(a.calls).toEqual([]);
  });

  it('a grant smaller than minTokens is never taken: a bucket of 100 gets none by default, of 1,000 one of 16+', async () => {
    const small = agent(100);
    const pool = new GrantPool(small.send, { hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    expect(run(pool, 20)).toBe(0);
    await flush();
    // A tenth of 100 is 10 tokens, under the default 16: every decision stays an agent decision.
    expect(small.calls).toEqual([]);
    const big = agent(1000);
    const thousand: Decision = {
      ...allowed,
      results: [{ ...allowed.results[0]!, remaining: 900, limit: 1000 }],
    };
    const pool2 = new GrantPool(big.send, { hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    const body = { policy: 'p', subject: 's' };
    for (let i = 0; i < 2; i++) {
      clock += 300;
      if (pool2.trySpend(body) === undefined) pool2.observe(body, thousand);
    }
    await flush();
    expect(big.calls[0]).toMatchObject({ path: '/v1/grants', body: { amount: 100 } });
    await pool.close();
    await pool2.close();
  });

  it('a hot subject gets a grant, spends it in-process and hands the rest back on close', async () => {
    const a = agent(100);
    // Hot from the first window: every subject counts as hot.
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 2);
    await flush();
    expect(a.calls[0]).toMatchObject({ path: '/v1/grants', body: { policy: 'p', subject: 's' } });
    // At most a tenth of the bucket the agent reported.
    expect(a.calls[0]!.body['amount']).toBeLessThanOrEqual(10);
    const granted = 100 - a.stock();
    expect(granted).toBeGreaterThan(0);
    expect(pool.stats().held).toBe(granted);
    const d = pool.trySpend({ policy: 'p', subject: 's' });
    expect(d).toMatchObject({
      allowed: true,
      local: 'grant',
      results: [{ limit: 100, remaining: granted - 1 }],
    });
    expect(d?.headers).toMatchObject({
      'RateLimit-Policy': '"p";q=100;w=60',
      RateLimit: `"p";r=${granted - 1}`,
    });
    await pool.close();
    expect(a.stock()).toBe(100 - 1);
    expect(pool.stats()).toMatchObject({ local: 1, held: 0, tokensReturned: granted - 1 });
  });

  it('hands a rest held over two grants back to each grant by its id, the newest first, at most what it took', async () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 2);
    await flush();
    expect(pool.stats().held).toBe(10);
    // 6 spent: 4 left, under half a grant, so the next grant (10) is taken and joins the rest.
    for (let i = 0; i < 6; i++) expect(pool.trySpend({ policy: 'p', subject: 's' })).toBeDefined();
    await flush();
    expect(pool.stats().held).toBe(14);
    const takes = a.calls.filter((c) => c.path === '/v1/grants').length;
    expect(takes).toBe(2);
    await pool.close();
    const returns = a.calls.filter((c) => c.path === '/v1/grants/return').map((c) => c.body);
    // The second grant's 10, then 4 of the first's: each return names a grant the agent gave, once.
    expect(returns.map((r) => r['amount'])).toEqual([10, 4]);
    expect(new Set(returns.map((r) => r['grant'])).size).toBe(2);
    expect(a.stock()).toBe(100 - 6);
    expect(pool.stats()).toMatchObject({ local: 6, held: 0, tokensReturned: 14, tokensLost: 0 });
  });

  it('counts tokens in whole micro-tokens: fractional costs leave no float noise in its stats', async () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    const s1 = { policy: 'p', subject: 's1' };
    const s2 = { policy: 'p', subject: 's2' };
    run(pool, 2, s1);
    run(pool, 2, s2);
    await flush();
    expect(pool.stats().held).toBe(20);
    expect(pool.trySpend({ ...s1, cost: 0.1 })).toBeDefined();
    for (let i = 0; i < 2; i++) expect(pool.trySpend({ ...s2, cost: 0.1 })).toBeDefined();
    await pool.close();
    // 9.9 and 9.8 handed back: their sum is 19.700000000000003 in floating point, 19.7 in what a person reads.
    expect(pool.stats()).toMatchObject({
      local: 3,
      held: 0,
      tokensTaken: 20,
      tokensReturned: 19.7,
      tokensLost: 0,
    });
  });

  it('layered checks, dry runs, idempotent requests and checks naming a class are never decided on a grant', async () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 3);
    await flush();
    expect(pool.stats().held).toBeGreaterThan(0);
    expect(pool.trySpend({ policy: 'p', subject: 's', dryRun: true })).toBeUndefined();
    expect(pool.trySpend({ policy: 'p', subject: 's', idempotencyKey: 'k' })).toBeUndefined();
    expect(pool.trySpend({ checks: [{ policy: 'p', subject: 's' }] })).toBeUndefined();
    // A grant is taken at the class the policy gives the subject: a check naming one is asked at the agent.
    expect(pool.trySpend({ policy: 'p', subject: 's', class: 'free' })).toBeUndefined();
    await pool.close();
  });

  it('a policy the agent gives no grants for is never asked again', async () => {
    const a = agent(100, 'AGT_ERR_GRANT_NOT_ALLOWED');
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9 }, now);
    run(pool, 3);
    await flush();
    run(pool, 20);
    await flush();
    expect(a.calls.length).toBe(1);
    expect(pool.stats()).toMatchObject({ failed: 1, local: 0 });
  });

  it('repeats an over-quota answer until the retry time, and never a failure-mode answer', async () => {
    const a = agent(0);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9 }, now);
    const body = { policy: 'p', subject: 's' };
    run(pool, 2);
    // A bucket 58 s from full again, where the cost fits in 5 s.
    const denied = (reason?: 'agent_unreachable', remaining = 0): Decision =>
      agentDenial(
        {
          policy: 'p',
          remaining,
          limit: 100,
          resetMs: 58_000,
          retryAfterMs: 5000,
          ...(reason === undefined ? {} : { reason }),
        },
        100,
      );
    pool.observe(body, denied('agent_unreachable'));
    expect(pool.trySpend(body)).toBeUndefined();
    // The first over-quota denial of a policy not yet known asks the grant route what it is (a token bucket:
    // answered, empty) and is not repeated; the next one is.
    pool.observe(body, denied());
    await flush();
    expect(a.calls.map((c) => c.path)).toEqual(['/v1/grants']);
    expect(pool.trySpend(body)).toBeUndefined();
    pool.observe(body, denied());
    const d = pool.trySpend(body);
    expect(d).toMatchObject({ allowed: false, local: 'grant', results: [{ remaining: 0 }] });
    expect(d?.headers['Retry-After']).toBe('5');
    // Another cost's wait is not known here: asked at the agent.
    expect(pool.trySpend({ ...body, cost: 2 })).toBeUndefined();
    expect(pool.trySpend({ ...body, cost: 0.5 })).toBeUndefined();
    // A denial of 3 with 2 tokens left: repeated with the agent's count, not a made-up 0.
    pool.observe({ ...body, cost: 3 }, denied(undefined, 2));
    const d3 = pool.trySpend({ ...body, cost: 3 });
    expect(d3?.results[0]?.remaining).toBe(2);
    // The agent's RateLimit item (draft-11: t the seconds until the quota is whole again, not the wait).
    expect(d3?.headers['RateLimit']).toBe('"p";r=2;t=58');
    expect(d3?.headers['Retry-After']).toBe('5');
    // A denial of a check naming a class is that class's bucket: never repeated for the subject's own.
    const other = { policy: 'p', subject: 'c' };
    expect(pool.trySpend(other)).toBeUndefined();
    pool.observe({ ...other, class: 'free' }, denied());
    expect(pool.trySpend(other)).toBeUndefined();
    expect(pool.trySpend({ ...other, class: 'free' })).toBeUndefined();
  });

  it('repeats denials of cold subjects too, and never those of a policy without grants', async () => {
    const denial: Decision = {
      allowed: false,
      retryAfterMs: 1500,
      results: [{ policy: 'p', allowed: false, remaining: 0, limit: 100, resetMs: 0, retryAfterMs: 1500 }],
      headers: {},
    };
    for (const [code, repeated] of [
      [undefined, 2],
      ['AGT_ERR_GRANT_NOT_ALLOWED', 0],
    ] as const) {
      const a = agent(0, code);
      // Never hot: no grant is taken for an admission.
      const pool = new GrantPool(a.send, { hotPerSecond: 1e9 }, now);
      const body = { policy: 'p', subject: 'cold' };
      expect(pool.trySpend(body)).toBeUndefined();
      pool.observe(body, denial);
      await flush();
      let local = 0;
      for (let i = 0; i < 3; i++) {
        const d = pool.trySpend(body);
        if (d === undefined) pool.observe(body, denial);
        else local++;
        await flush();
      }
      // The first denial asks the grant route once; then every denial within 1.5 s is answered here.
      expect([local, a.calls.length, pool.stats().denied]).toEqual([repeated, 1, repeated]);
      await pool.close();
    }
  });

  it.each(RATE_LIMIT_DRAFTS)(
    'the denial cache never admits, refuses only what the bucket refuses, and tells the exact wait (%s)',
    async (draft) => {
      // One subject's token bucket at the agent (10 tokens, 2 per second) on the test's clock, deciding and granting.
      const capacity = 10;
      const perMs = 2 / 1000;
      let tokens = capacity;
      let at = clock;
      const refill = () => {
        tokens = Math.min(capacity, tokens + (clock - at) * perMs);
        at = clock;
      };
      const waitFor = (cost: number) => Math.ceil((cost - tokens) / perMs);
      /** Until the bucket is full again, ms. */
      const resetIn = () => (capacity - tokens) / perMs;
      let admitted = 0;
      /** What the agent last said was left when it denied each cost, and the instant its `t` counted down to. */
      const toldRemaining = new Map<number, number>();
      const toldT = new Map<number, number>();
      const decide = (cost: number): Decision => {
        refill();
        if (tokens >= cost) {
          tokens -= cost;
          admitted++;
          return { ...allowed, results: [{ ...allowed.results[0]!, limit: capacity }] };
        }
        const wait = waitFor(cost);
        const remaining = Math.floor(tokens);
        toldRemaining.set(cost, remaining);
        // -11: t the time until the quota is whole again; -10 (a denial): until the cost fits.
        toldT.set(cost, clock + (draft === 'draft-11' ? resetIn() : wait));
        const result = { policy: 'p', remaining, limit: capacity, resetMs: resetIn(), retryAfterMs: wait };
        return agentDenial(result, capacity / 2, draft);
      };
      const { send } = batched((path, body) => {
        refill();
        const amount = (body as { amount: number }).amount;
        if (path === '/v1/grants') {
          const granted = Math.min(Math.floor(tokens), amount, 1);
          tokens -= granted;
          return {
            status: 200,
            json: {
              policy: 'p',
              granted,
              limit: capacity,
              remaining: Math.floor(tokens),
              refillMs: 500,
              expiresInMs: 60_000,
              grant: granted > 0 ? idOf(Math.round(clock)) : null,
            },
          };
        }
        tokens = Math.min(capacity, tokens + amount);
        return { status: 200, json: { policy: 'p', credited: amount, dropped: 0 } };
      });
      const pool = new GrantPool(send, { hotPerSecond: 1e9 }, now);
      const start = clock;
      let local = 0;
      let cached = 0;
      for (let i = 0; i < 400; i++) {
        clock += 37;
        const cost = i % 7 === 0 ? 3 : 1;
        const body = { policy: 'p', subject: 's', cost };
        const d = pool.trySpend(body);
        if (d === undefined) pool.observe(body, decide(cost));
        else if (d.allowed) local++;
        else {
          cached++;
          // Refused here only when the bucket lacks the cost now, and told exactly when it will hold it.
          refill();
          expect(tokens).toBeLessThan(cost);
          expect(d.retryAfterMs).toBe(waitFor(cost));
          const seconds = Math.max(1, Math.ceil(waitFor(cost) / 1000));
          expect(d.headers['Retry-After']).toBe(String(seconds));
          // The tokens left are the agent's word at its denial of this cost, fewer than the cost.
          const told = toldRemaining.get(cost)!;
          expect(told).toBeLessThan(cost);
          expect(d.results[0]!.remaining).toBe(told);
          // Its t is the agent's, counted down: -10, the wait (Retry-After); -11, the time until the quota is
          // whole, which the bucket spending tokens since only makes later, never sooner.
          const t = Math.ceil((toldT.get(cost)! - clock) / 1000);
          expect(d.headers['RateLimit']).toBe(`"p";r=${told};t=${t}`);
          if (draft === 'draft-10') expect(t).toBe(seconds);
          else expect(t).toBeLessThanOrEqual(Math.ceil(resetIn() / 1000));
        }
        await flush();
      }
      // Never more admissions (at the agent, plus on grants) than the bucket held and refilled.
      expect(admitted + local).toBeLessThanOrEqual(capacity + ((clock - start) * 2) / 1000);
      expect(cached).toBeGreaterThan(100);
      await pool.close();
    },
  );
});

/**
 * A pool whose subject `s` of policy `p` the agent denied a cost of 1 (bucket of 100, a window of `windowSeconds`)
 * after the grant route told the pool it is a token bucket: that denial is repeated from then on. `denial(limit)`
 * is the agent's answer, for another limit too.
 */
async function denying(windowSeconds: number) {
  const pool = new GrantPool(agent(0).send, { hotPerSecond: 1e9 }, now);
  const body = { policy: 'p', subject: 's' };
  const denial = (limit: number) =>
    agentDenial({ policy: 'p', remaining: 0, limit, resetMs: 58_000, retryAfterMs: 5000 }, windowSeconds);
  expect(pool.trySpend(body)).toBeUndefined();
  pool.observe(body, denial(100));
  await flush();
  pool.observe(body, denial(100));
  return { pool, body, denial };
}

/** Costs the agent refuses (AGT_ERR_INVALID_COST): none is a number of at least one micro-token. */
const INVALID_COSTS = [NaN, -1, 0, Infinity, -Infinity, 1e-7, '3' as unknown as number];

describe('GrantPool: only a cost the agent accepts', () => {
  it('a grant of N never decides NaN, -1, 0, Infinity or a string, keeps its tokens, and admits at most N', async () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 2);
    await flush();
    const held = pool.stats().held;
    expect(held).toBe(10);
    const body = { policy: 'p', subject: 's' };
    for (const cost of INVALID_COSTS) {
      expect(pool.trySpend({ ...body, cost })).toBeUndefined();
      expect(pool.stats().held).toBe(held);
    }
    // Within one turn (no next grant arrives): however the invalid costs are mixed in, the grant admits its N.
    let local = 0;
    for (let i = 0; i < 3 * held; i++) {
      for (const cost of INVALID_COSTS) expect(pool.trySpend({ ...body, cost })).toBeUndefined();
      if (pool.trySpend(body)?.allowed === true) local++;
    }
    expect(local).toBe(held);
    expect(pool.stats()).toMatchObject({ local: held, held: 0 });
    await pool.close();
  });

  it("a grant is spent only on checks up to the policy's maxCost its answer names (1 when it names none)", async () => {
    for (const [maxCost, spends] of [
      [3, [1, 2, 3]],
      [undefined, [1]],
    ] as const) {
      const a = agent(100, undefined, maxCost);
      const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
      run(pool, 2);
      await flush();
      expect(pool.stats().held).toBe(10);
      const body = { policy: 'p', subject: 's' };
      for (const cost of [1, 2, 3, 4])
        expect(pool.trySpend({ ...body, cost })?.allowed, `maxCost ${maxCost}, cost ${cost}`).toBe(
          (spends as readonly number[]).includes(cost) ? true : undefined,
        );
      await pool.close();
    }
  });

  it('an answer to an invalid cost teaches nothing: no denial of it is repeated, and the one held stands', async () => {
    // A token bucket (learned from the grant route), whose denial of a cost of 1 is repeated.
    const { pool, body, denial } = await denying(100);
    expect(pool.trySpend(body)?.allowed).toBe(false);
    for (const cost of INVALID_COSTS) {
      // As if the agent had answered one (another limit and policy header, too): nothing of it is kept.
      pool.observe({ ...body, cost }, denial(999));
      expect(pool.trySpend({ ...body, cost })).toBeUndefined();
    }
    const d = pool.trySpend(body);
    expect(d).toMatchObject({ allowed: false, local: 'grant', results: [{ limit: 100 }] });
    expect(d?.headers['RateLimit-Policy']).toBe('"p";q=100;w=100');
    await pool.close();
  });
});

describe('GrantPool: a repeated denial says what the agent would', () => {
  it.each(RATE_LIMIT_DRAFTS)(
    'the RateLimit, Retry-After and legacy headers of the agent, counted down (%s)',
    async (draft) => {
      // One subject's bucket: 100 tokens refilling one per 100 s, 0.4 left. A token fits in 60 s; it is full
      // again in 9,960 s. Nothing else spends it, so the agent's answer at any moment is known exactly.
      const perMs = 0.01 / 1000;
      const start = clock;
      const agentAnswer = (): Decision => {
        const tokens = 0.4 + (clock - start) * perMs;
        const result = {
          policy: 'p',
          remaining: Math.floor(tokens),
          limit: 100,
          resetMs: (100 - tokens) / perMs,
          retryAfterMs: (1 - tokens) / perMs,
        };
        return agentDenial(result, 10_000, draft, true);
      };
      const a = agent(0);
      const pool = new GrantPool(a.send, { hotPerSecond: 1e9 }, now);
      const body = { policy: 'p', subject: 's' };
      expect(pool.trySpend(body)).toBeUndefined();
      pool.observe(body, agentAnswer());
      await flush();
      clock += 100;
      pool.observe(body, agentAnswer());
      // The last moment is 48.95 s after the first answer: a t counted down from its whole seconds (9,960 and
      // 60, said when 9,959.9 and 59.9 were meant) would be a second late there. Past DENIAL_RECHECK_MS one
      // check asks the agent again, and its answer is the one counted down from then on.
      let observedAt = clock;
      for (const later of [0, 2500, 999, 30_200, 15_000, 251]) {
        clock += later;
        if (clock - observedAt >= DENIAL_RECHECK_MS) {
          expect(pool.trySpend(body)).toBeUndefined();
          pool.observe(body, agentAnswer());
          observedAt = clock;
        }
        const d = pool.trySpend(body);
        expect(d).toMatchObject({ allowed: false, local: 'grant' });
        expect(d?.headers).toEqual(agentAnswer().headers);
      }
      // -11's t says when the quota is whole again (thousands of seconds), not when to retry.
      const t = Number(/;t=(\d+)$/.exec(pool.trySpend(body)!.headers['RateLimit']!)![1]);
      expect(t).toBe(draft === 'draft-11' ? 9911 : 11);
      await pool.close();
    },
  );

  it("RateLimit-Policy follows the agent's latest answer; a changed limit drops the subject's denial", async () => {
    const { pool, body, denial } = await denying(60);
    expect(pool.trySpend(body)?.headers['RateLimit-Policy']).toBe('"p";q=100;w=60');
    // The policy edited (q=500): another subject's answer says so, and the repeated denial says it too.
    const other = { policy: 'p', subject: 'o' };
    pool.trySpend(other);
    pool.observe(other, {
      ...allowed,
      results: [{ ...allowed.results[0]!, limit: 500 }],
      headers: { 'RateLimit-Policy': '"p";q=500;w=60' },
    });
    expect(pool.trySpend(body)?.headers['RateLimit-Policy']).toBe('"p";q=500;w=60');
    // The subject's own answer (another cost, asked at the agent, admitted) shows its bucket's new limit: the
    // denial remembered from the old bucket is no longer repeated, and the agent's next one is, with the new q.
    expect(pool.trySpend({ ...body, cost: 2 })).toBeUndefined();
    pool.observe(
      { ...body, cost: 2 },
      {
        ...allowed,
        results: [{ ...allowed.results[0]!, limit: 500 }],
        headers: { 'RateLimit-Policy': '"p";q=500;w=60' },
      },
    );
    expect(pool.trySpend(body)).toBeUndefined();
    pool.observe(body, denial(500));
    const d = pool.trySpend(body);
    expect(d).toMatchObject({ allowed: false, local: 'grant', results: [{ limit: 500 }] });
    expect(d?.headers['RateLimit-Policy']).toBe('"p";q=500;w=60');
    await pool.close();
  });
});

describe('GrantPool: takes and returns travel in batches', () => {
  /** One check of each of `n` subjects, hot at once, then observed admitted: each wants a grant. */
  const wantGrants = (pool: GrantPool, n: number, from = 0) => {
    for (let i = from; i < from + n; i++) {
      const body = { policy: 'p', subject: `s${i}` };
      clock += 300;
      pool.trySpend(body);
      clock += 300;
      if (pool.trySpend(body) === undefined) pool.observe(body, allowed);
    }
  };

  it('the takes of one turn leave in one exchange, and the returns at close in one more', async () => {
    const a = agent(10_000);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    wantGrants(pool, 30);
    await flush();
    expect(a.exchanges.length).toBe(1);
    expect(a.exchanges[0]!.takes).toHaveLength(30);
    expect(a.exchanges[0]!.returns).toBeUndefined();
    expect(pool.stats()).toMatchObject({ taken: 30, held: 300, failed: 0 });
    await pool.close();
    expect(a.exchanges.length).toBe(2);
    expect(a.exchanges[1]!.returns).toHaveLength(30);
    expect(a.exchanges[1]!.takes).toBeUndefined();
    expect(pool.stats()).toMatchObject({ held: 0, tokensReturned: 300, tokensLost: 0 });
    expect(a.stock()).toBe(10_000);
  });

  it('at most 128 items an exchange: 200 takes in one turn leave in two', async () => {
    const a = agent(100_000);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    wantGrants(pool, 200);
    await flush();
    expect(a.exchanges.map((e) => e.takes?.length)).toEqual([128, 72]);
    expect(pool.stats().taken).toBe(200);
    await pool.close();
  });

  it('one item refused fails no other; a policy refused is never asked again', async () => {
    const a = agent(1000);
    const refusing = batched((path, body) => {
      if ((body as { subject: string }).subject === 's1') {
        const code = 'AGT_ERR_GRANT_NOT_ALLOWED';
        return { status: 400, json: { code }, code };
      }
      return {
        status: 200,
        json: {
          policy: 'p',
          granted: 5,
          limit: 100,
          remaining: 90,
          refillMs: 0,
          expiresInMs: 1000,
          grant: idOf(Number((body as { subject: string }).subject.slice(1))),
        },
      };
    });
    const pool = new GrantPool(refusing.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    wantGrants(pool, 3);
    await flush();
    expect(refusing.exchanges[0]!.takes).toHaveLength(3);
    expect(pool.stats()).toMatchObject({ taken: 2, failed: 1, held: 10 });
    expect(a.calls).toEqual([]);
    await pool.close();
  });

  it('an exchange not answered fails its takes (backed off) and loses its returns, never more', async () => {
    let up = true;
    const a = agent(1000);
    const send: GrantTransport = (path, body) =>
      up ? a.send(path, body) : Promise.reject(new Error('connection refused'));
    const pool = new GrantPool(send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    wantGrants(pool, 2);
    await flush();
    expect(pool.stats()).toMatchObject({ taken: 2, held: 20 });
    up = false;
    wantGrants(pool, 2, 2);
    await flush();
    // s2 and s3 asked in one exchange and got no answer: both failed, nothing held for them.
    expect(pool.stats()).toMatchObject({ taken: 2, failed: 2, held: 20 });
    await pool.close();
    expect(pool.stats()).toMatchObject({ held: 0, tokensReturned: 0, tokensLost: 20 });
    // The agent kept what it gave: fewer admissions, never more.
    expect(a.stock()).toBe(980);
  });

  it('an agent without the batch route gets takes and returns one by one, from then on', async () => {
    const a = agent(1000);
    let batches = 0;
    const send: GrantTransport = (path, body) => {
      if (path === '/v1/grants/batch') {
        batches++;
        const code = 'AGT_ERR_NOT_FOUND';
        return Promise.resolve({ status: 404, json: { code }, code });
      }
      return a.send(path, body);
    };
    const pool = new GrantPool(send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    wantGrants(pool, 3);
    await flush();
    expect(pool.stats()).toMatchObject({ taken: 3, held: 30 });
    await pool.close();
    expect(batches).toBe(1);
    expect(a.calls.map((c) => c.path)).toEqual([
      ...Array<string>(3).fill('/v1/grants'),
      ...Array<string>(3).fill('/v1/grants/return'),
    ]);
    expect(pool.stats()).toMatchObject({ held: 0, tokensReturned: 30 });
  });

  it('a longer horizon asks to hold the grant that long (at most 5 s); a cold subject hands its rest back early', async () => {
    const a = agent(1000);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 4000 }, now);
    wantGrants(pool, 1);
    await flush();
    expect(a.exchanges[0]!.takes).toEqual([{ policy: 'p', subject: 's0', amount: 10, ttlMs: 4000 }]);
    expect(pool.stats().held).toBe(10);
    // No check of s0 for 10 s of the pool's clock: at the next sweep (each second) its rest goes back.
    clock += 10_000;
    await new Promise((r) => setTimeout(r, 1100));
    await flush();
    expect(a.exchanges[1]!.returns).toEqual([expect.objectContaining({ subject: 's0', amount: 10 })]);
    expect(pool.stats()).toMatchObject({ held: 0, tokensReturned: 10 });
    const long = agent(1000);
    const capped = new GrantPool(long.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 60_000 }, now);
    wantGrants(capped, 1);
    await flush();
    expect(long.exchanges[0]!.takes).toEqual([expect.objectContaining({ ttlMs: 5000 })]);
    await pool.close();
    await capped.close();
  });
});

describe('GrantPool: what it holds follows the bucket', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a cached denial is answered for DENIAL_RECHECK_MS at most: a raised budget admits at the next check', async () => {
    const { pool, body, denial } = await denying(60);
    // The agent said 5 s; the cache answers the first second only.
    clock += DENIAL_RECHECK_MS - 1;
    expect(pool.trySpend(body)).toMatchObject({ allowed: false, local: 'grant', retryAfterMs: 4001 });
    clock += 1;
    expect(pool.trySpend(body)).toBeUndefined();
    // Still refused: cached again, for another second at most, with the agent's new wait.
    pool.observe(body, denial(100));
    expect(pool.trySpend(body)).toMatchObject({ allowed: false, retryAfterMs: 5000 });
    clock += DENIAL_RECHECK_MS;
    expect(pool.trySpend(body)).toBeUndefined();
    // The budget raised meanwhile: the agent admits, and nothing is repeated.
    pool.observe(body, { ...allowed, results: [{ ...allowed.results[0]!, limit: 500 }] });
    expect(pool.trySpend(body)).toBeUndefined();
    await pool.close();
  });

  it('a wall-clock step back does not stretch a cached denial (the pool keeps a monotonic clock)', async () => {
    vi.useFakeTimers({ toFake: ['Date', 'performance', 'setTimeout', 'setInterval', 'setImmediate'] });
    const pool = new GrantPool(agent(0).send, { hotPerSecond: 1e9 });
    const body = { policy: 'p', subject: 's' };
    const denial = agentDenial(
      { policy: 'p', remaining: 0, limit: 100, resetMs: 800, retryAfterMs: 800 },
      60,
    );
    expect(pool.trySpend(body)).toBeUndefined();
    pool.observe(body, denial);
    await vi.runOnlyPendingTimersAsync();
    pool.observe(body, denial);
    expect(pool.trySpend(body)).toMatchObject({ allowed: false, local: 'grant' });
    // NTP steps the wall clock back ten minutes; 800 ms pass.
    vi.setSystemTime(Date.now() - 600_000);
    vi.advanceTimersByTime(800);
    expect(pool.trySpend(body)).toBeUndefined();
    await pool.close();
  });

  it('tokens held from a bucket whose limit changed are handed back, not spent under the new limit', async () => {
    const a = agent(1000);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 2);
    await flush();
    expect(pool.stats().held).toBe(10);
    const body = { policy: 'p', subject: 's' };
    expect(pool.trySpend(body)).toMatchObject({ allowed: true, local: 'grant' });
    // The policy lowered: the subject's next answer from the agent (another cost, not decided here) says limit 20.
    expect(pool.trySpend({ ...body, cost: 50 })).toBeUndefined();
    pool.observe({ ...body, cost: 50 }, { ...allowed, results: [{ ...allowed.results[0]!, limit: 20 }] });
    expect(pool.stats().held).toBe(0);
    await flush();
    const returned = a.calls.filter((c) => c.path === '/v1/grants/return').map((c) => c.body['amount']);
    expect(returned).toEqual([9]);
    await pool.close();
  });

  it('a policy made strict: tokens held from its regional bucket are handed back, nothing more is decided here', async () => {
    const a = agent(1000);
    const pool = new GrantPool(a.send, { minTokens: 1, hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    const body = { policy: 'p', subject: 's' };
    const other = { policy: 'p', subject: 'o' };
    run(pool, 2, body);
    run(pool, 2, other);
    await flush();
    expect(pool.stats().held).toBe(20);
    expect(pool.trySpend(body)).toMatchObject({ allowed: true, local: 'grant' });
    // The operator makes the policy strict (its home decides it, with the whole budget): the next answer from the
    // agent for this subject says so, with the same limit as the regional bucket had. The other subject, decided
    // on its grant, gets no answer to learn it from: its grant goes back too.
    const strict = { ...allowed.results[0]!, mode: 'strict' as const };
    pool.observe({ ...body, cost: 50 }, { ...allowed, results: [strict] });
    expect(pool.stats().held).toBe(0);
    for (let i = 0; i < 5; i++) {
      expect(pool.trySpend(body)).toBeUndefined();
      expect(pool.trySpend(other)).toBeUndefined();
    }
    await flush();
    const returned = a.calls.filter((c) => c.path === '/v1/grants/return').map((c) => c.body['amount']);
    expect(returned.sort()).toEqual([10, 9]);
    expect(pool.stats()).toMatchObject({ local: 1, tokensReturned: 19 });
    await pool.close();
  });
});
