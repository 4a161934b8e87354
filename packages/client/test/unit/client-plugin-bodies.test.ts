/**
 * The Fastify plugin's problem bodies, byte for byte: a 429 with its reason, a shed (503 LIMITER_BUSY) and a
 * misconfigured route (500 with `agent-code`) keep their keys in this order, however the plugin builds them
 * (packages/client/src/fastify.ts). The client is a stand-in that answers with a fixed decision or refusal: what is
 * held here is the plugin's rendering of it.
 */
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { AgentRequestError, type AgentClient, type Decision } from '../../src/agent-client.js';
import { quotaplane } from '../../src/fastify.js';

async function answer(
  decide: () => Promise<Decision>,
): Promise<{ status: number; type: string; body: string }> {
  const app = Fastify();
  const client = { decideInline: decide } as unknown as AgentClient;
  await app.register(quotaplane, { client, subject: () => 't1' });
  app.get('/work', { config: { quota: { policy: 'p' } } }, () => ({ ok: true }));
  const res = await app.inject({ method: 'GET', url: '/work' });
  await app.close();
  return { status: res.statusCode, type: String(res.headers['content-type']), body: res.body };
}

const denied = (reason: string): Decision => ({
  allowed: false,
  retryAfterMs: 600,
  results: [
    { policy: 'p', allowed: false, resetMs: null, retryAfterMs: 600, reason } as Decision['results'][0],
  ],
  headers: { 'Retry-After': '1' },
});

/** The keys of a problem document, in the order the plugin writes them (RFC 9457's, then the quota's). */
const PROBLEM_KEYS = ['type', 'title', 'status', 'code', 'detail', 'violated-policies'];

describe('plugin problem bodies', () => {
  it('a 429 names the violated policy, then the reason, last', async () => {
    const a = await answer(() => Promise.resolve(denied('subject_exhausted')));
    expect(a.status).toBe(429);
    expect(a.type).toBe('application/problem+json; charset=utf-8');
    expect(a.body).toBe(
      '{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",' +
        '"title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,' +
        '"code":"RATE_LIMITED","detail":"quota exceeded for p","violated-policies":["p"],"reason":"subject_exhausted"}',
    );
  });

  it('a 429 of a request over quota on one policy and unavailable on another names only the one over quota', async () => {
    const mixed: Decision = {
      allowed: false,
      retryAfterMs: 600,
      results: [
        // A strict policy whose home could not be reached (fails closed), then a quota refusal.
        { policy: 'far', allowed: false, resetMs: null, retryAfterMs: 1000, reason: 'home_unreachable' },
        { policy: 'p', allowed: false, resetMs: null, retryAfterMs: 600, reason: 'subject_exhausted' },
      ] as Decision['results'],
      headers: { 'Retry-After': '1' },
    };
    const a = await answer(() => Promise.resolve(mixed));
    expect(a.status).toBe(429);
    expect(JSON.parse(a.body)).toMatchObject({
      code: 'RATE_LIMITED',
      detail: 'quota exceeded for p',
      'violated-policies': ['p'],
      reason: 'subject_exhausted',
    });
  });

  it("one route's 429s, each serialized once, keep each refusal's own reason", async () => {
    const reasons = [
      'subject_exhausted',
      'share_exhausted',
      'subject_exhausted',
      undefined,
      'share_exhausted',
    ];
    let i = 0;
    const app = Fastify();
    const decide = () => {
      const d = denied('x');
      const reason = reasons[i++];
      if (reason === undefined) delete d.results[0]!.reason;
      else d.results[0]!.reason = reason as Decision['results'][0]['reason'];
      return Promise.resolve(d);
    };
    await app.register(quotaplane, {
      client: { decideInline: decide } as unknown as AgentClient,
      subject: () => 't1',
    });
    app.get('/work', { config: { quota: { policy: 'p' } } }, () => ({ ok: true }));
    const seen: (string | undefined)[] = [];
    for (let n = 0; n < reasons.length; n++) {
      const res = await app.inject({ method: 'GET', url: '/work' });
      expect(res.statusCode).toBe(429);
      expect(res.headers['content-type']).toBe('application/problem+json; charset=utf-8');
      seen.push((JSON.parse(res.body) as { reason?: string }).reason);
    }
    await app.close();
    expect(seen).toEqual(reasons);
  });

  it('a 429 without a reason has no reason key', async () => {
    const d = denied('x');
    delete d.results[0]!.reason;
    const a = await answer(() => Promise.resolve(d));
    expect(JSON.parse(a.body)).not.toHaveProperty('reason');
    expect(Object.keys(JSON.parse(a.body) as object)).toEqual(PROBLEM_KEYS);
  });

  it('a shed decision of a closed policy is 503 LIMITER_BUSY, its code and detail where the 503 has them', async () => {
    const a = await answer(() =>
      Promise.resolve({ ...denied('client_shed'), degraded: 'fail_closed', failure: 'shed' }),
    );
    expect(a.status).toBe(503);
    expect(JSON.parse(a.body)).toEqual({
      type: expect.any(String) as unknown,
      title: 'Temporary Reduced Capacity',
      status: 503,
      code: 'LIMITER_BUSY',
      detail:
        'this service has too many rate-limit decisions waiting to decide p now, and the policy fails closed',
      'violated-policies': ['p'],
    });
    expect(Object.keys(JSON.parse(a.body) as object)).toEqual(PROBLEM_KEYS);
  });

  it('a refusal of the configuration is 500 QUOTA_MISCONFIGURED with the agent code last', async () => {
    const refusal = new AgentRequestError({
      type: 'about:blank',
      title: 'Not Found',
      status: 404,
      code: 'AGT_ERR_UNKNOWN_POLICY',
      detail: 'unknown policy p',
    });
    const a = await answer(() => Promise.reject(refusal));
    expect(a.status).toBe(500);
    const body = JSON.parse(a.body) as Record<string, unknown>;
    expect(Object.keys(body)).toEqual(['type', 'title', 'status', 'code', 'detail', 'agent-code']);
    expect(body).toMatchObject({
      status: 500,
      code: 'QUOTA_MISCONFIGURED',
      'agent-code': 'AGT_ERR_UNKNOWN_POLICY',
    });
  });
});
