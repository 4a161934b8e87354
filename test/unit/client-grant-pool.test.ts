import { describe, expect, it } from 'vitest';
import type { Decision } from '../../packages/client/src/agent-client.js';
import { GrantPool, type GrantTransport } from '../../packages/client/src/grants.js';

const allowed: Decision = {
  allowed: true,
  retryAfterMs: 0,
  results: [{ policy: 'p', allowed: true, remaining: 50, limit: 100, resetMs: 0, retryAfterMs: 0 }],
  headers: { 'RateLimit-Policy': '"p";q=100;w=60' },
};

/** A transport that grants what is asked (up to `stock`) and records every call. */
function agent(stock: number, code?: string) {
  const calls: { path: string; body: Record<string, unknown> }[] = [];
  const send: GrantTransport = (path, body) => {
    calls.push({ path, body: body as Record<string, unknown> });
    if (code !== undefined) return Promise.resolve({ status: 400, json: { code }, code });
    if (path === '/v1/grants') {
      const granted = Math.min(stock, (body as { amount: number }).amount);
      stock -= granted;
      return Promise.resolve({
        status: 200,
        json: { policy: 'p', granted, limit: 100, remaining: stock, refillMs: 0, expiresInMs: 1000 },
      });
    }
    stock += (body as { amount: number }).amount;
    return Promise.resolve({
      status: 200,
      json: { policy: 'p', credited: (body as { amount: number }).amount, dropped: 0 },
    });
  };
  return { send, calls, stock: () => stock };
}

let clock = 1_750_000_000_000;
const now = () => clock;

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

const flush = () => new Promise((r) => setTimeout(r, 0));

describe('GrantPool', () => {
  it('a cold subject is never granted', () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { hotPerSecond: 1e9 }, now);
    expect(run(pool, 50)).toBe(0);
    expect(a.calls).toEqual([]);
  });

  it('a hot subject gets a grant, spends it in-process and hands the rest back on close', async () => {
    const a = agent(100);
    // Hot from the first window: every subject counts as hot.
    const pool = new GrantPool(a.send, { hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
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

  it('layered checks, dry runs and idempotent requests are never decided on a grant', async () => {
    const a = agent(100);
    const pool = new GrantPool(a.send, { hotPerSecond: 1e-9, horizonMs: 1e9 }, now);
    run(pool, 3);
    await flush();
    expect(pool.stats().held).toBeGreaterThan(0);
    expect(pool.trySpend({ policy: 'p', subject: 's', dryRun: true })).toBeUndefined();
    expect(pool.trySpend({ policy: 'p', subject: 's', idempotencyKey: 'k' })).toBeUndefined();
    expect(pool.trySpend({ checks: [{ policy: 'p', subject: 's' }] })).toBeUndefined();
    await pool.close();
  });

  it('a policy the agent gives no grants for is never asked again', async () => {
    const a = agent(100, 'AGT_ERR_GRANT_NOT_ALLOWED');
    const pool = new GrantPool(a.send, { hotPerSecond: 1e-9 }, now);
    run(pool, 3);
    await flush();
    run(pool, 20);
    await flush();
    expect(a.calls.length).toBe(1);
    expect(pool.stats()).toMatchObject({ failed: 1, local: 0 });
  });

  it('repeats an over-quota answer for a hot subject until the retry time, and never a failure-mode answer', () => {
    const pool = new GrantPool(agent(0).send, { hotPerSecond: 1e-9 }, now);
    const body = { policy: 'p', subject: 's' };
    run(pool, 2);
    const denied = (reason?: 'agent_unreachable'): Decision => ({
      allowed: false,
      retryAfterMs: 5000,
      results: [
        {
          policy: 'p',
          allowed: false,
          remaining: 0,
          limit: 100,
          resetMs: 0,
          retryAfterMs: 5000,
          ...(reason === undefined ? {} : { reason }),
        },
      ],
      headers: {},
    });
    pool.observe(body, denied('agent_unreachable'));
    expect(pool.trySpend(body)).toBeUndefined();
    pool.observe(body, denied());
    const d = pool.trySpend(body);
    expect(d).toMatchObject({ allowed: false, local: 'grant', results: [{ remaining: 0 }] });
    expect(d?.headers['Retry-After']).toBe('5');
    // A larger cost is denied too; a smaller one may fit: asked at the agent.
    expect(pool.trySpend({ ...body, cost: 2 })?.allowed).toBe(false);
    expect(pool.trySpend({ ...body, cost: 0.5 })).toBeUndefined();
  });
});
