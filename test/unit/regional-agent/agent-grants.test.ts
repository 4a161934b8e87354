import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../../core/clock.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';

const policies = [
  parsePolicy({ name: 'hot', capacity: 100, refillPerSecond: 1e-4 }),
  parsePolicy({ name: 'small', capacity: 5, refillPerSecond: 1e-4 }),
  parsePolicy({ name: 'log', kind: 'sliding_log', capacity: 5, windowSeconds: 60 }),
  parsePolicy({ name: 'daily', kind: 'daily', capacity: 50 }),
  parsePolicy({ name: 'sharded', capacity: 100, refillPerSecond: 1, shards: 4 }),
  parsePolicy({ name: 'strict', capacity: 100, refillPerSecond: 1, mode: 'strict', homeRegion: 'us' }),
];

function agent() {
  const clock = new ManualClock(1_750_000_000_000);
  const built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource(policies),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      random: () => 0,
    },
    AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' }),
  );
  const post = async (url: string, payload: object) => {
    await built.ready;
    const res = await built.app.inject({ method: 'POST', url, payload });
    return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
  };
  const metric = async (line: RegExp) => {
    const text = (await built.app.inject({ method: 'GET', url: '/metrics' })).body;
    return Number(line.exec(text)?.[1] ?? 0);
  };
  return { post, metric, built };
}

describe('POST /v1/grants and /v1/grants/return', () => {
  it('a grant leaves the bucket: decisions see the tokens gone; a return puts back what fits', async () => {
    const { post, metric } = agent();
    const g = await post('/v1/grants', { policy: 'hot', subject: 'a', amount: 50 });
    // At most a tenth of the bucket per grant.
    const grant = g.body['grant'] as string;
    expect(grant).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(g).toEqual({
      status: 200,
      body: {
        policy: 'hot',
        granted: 10,
        limit: 100,
        remaining: 90,
        refillMs: 0,
        expiresInMs: 1000,
        grant,
        // The policy's maxCost (1 by default): the client spends a grant only on checks up to it.
        maxCost: 1,
      },
    });
    const d = await post('/v1/decisions', { policy: 'hot', subject: 'a' });
    expect(d.body).toMatchObject({ allowed: true, results: [{ remaining: 89 }] });
    const r = await post('/v1/grants/return', { policy: 'hot', subject: 'a', grant, amount: 4 });
    expect(r).toEqual({ status: 200, body: { policy: 'hot', credited: 4, dropped: 0 } });
    expect((await post('/v1/decisions', { policy: 'hot', subject: 'a' })).body).toMatchObject({
      results: [{ remaining: 92 }],
    });
    // A grant is handed back once: its second return credits nothing.
    const twice = await post('/v1/grants/return', { policy: 'hot', subject: 'a', grant, amount: 4 });
    expect(twice).toMatchObject({ status: 404, body: { code: 'AGT_ERR_UNKNOWN_GRANT' } });
    // Handing back more than a grant took mints nothing: only what it took is credited.
    const g2 = await post('/v1/grants', { policy: 'hot', subject: 'a', amount: 10 });
    expect(g2.body).toMatchObject({ granted: 10, remaining: 82 });
    const over = await post('/v1/grants/return', {
      policy: 'hot',
      subject: 'a',
      grant: g2.body['grant'],
      amount: 20,
    });
    expect(over.body).toEqual({ policy: 'hot', credited: 10, dropped: 10 });
    expect((await post('/v1/decisions', { policy: 'hot', subject: 'a' })).body).toMatchObject({
      results: [{ remaining: 91 }],
    });
    expect(
      await metric(/quotaplane_grant_tokens_total\{[^}]*policy="hot"[^}]*flow="taken"[^}]*\} (\S+)/),
    ).toBe(20);
    expect(
      await metric(/quotaplane_grant_tokens_total\{[^}]*policy="hot"[^}]*flow="dropped"[^}]*\} (\S+)/),
    ).toBe(10);
    expect(
      await metric(/quotaplane_grants_total\{[^}]*policy="hot"[^}]*outcome="unknown"[^}]*\} (\S+)/),
    ).toBe(1);
  });

  it('an empty bucket grants nothing and says when it could', async () => {
    const { post } = agent();
    for (let i = 0; i < 5; i++) await post('/v1/decisions', { policy: 'small', subject: 'b' });
    const g = await post('/v1/grants', { policy: 'small', subject: 'b', amount: 3 });
    expect(g.status).toBe(200);
    expect(g.body).toMatchObject({ granted: 0, limit: 5, remaining: 0 });
    expect(g.body['refillMs']).toBeGreaterThan(0);
  });

  it('counter kinds, sharded and strict policies give no grants, and nothing is taken', async () => {
    const { post } = agent();
    for (const policy of ['log', 'daily', 'sharded', 'strict']) {
      const g = await post('/v1/grants', { policy, subject: 'c', amount: 1 });
      expect(g.status, policy).toBe(400);
      expect(g.body['code'], policy).toBe('AGT_ERR_GRANT_NOT_ALLOWED');
    }
    const d = await post('/v1/decisions', { policy: 'sharded', subject: 'c' });
    expect(d.body).toMatchObject({ allowed: true, results: [{ remaining: 24 }] });
  });

  it('bad bodies are refused with a stable code and change nothing', async () => {
    const { post } = agent();
    const bad = [
      {},
      { policy: 'hot', subject: 'd' },
      { policy: 'hot', subject: 'd', amount: 0 },
      { policy: 'hot', subject: 'd', amount: 1.5 },
      { policy: 'hot', subject: 'd', amount: 1001 },
      { policy: 'hot', subject: 'd', amount: 1, extra: true },
    ];
    for (const body of bad) {
      const g = await post('/v1/grants', body);
      expect(g.status, JSON.stringify(body)).toBe(400);
      expect(g.body['code']).toBe('AGT_ERR_INVALID_GRANT');
    }
    const id = 'AAAAAAAAAAAAAAAAAAAAAA';
    for (const body of [
      { policy: 'hot', subject: 'd', grant: id, amount: -1 },
      { policy: 'hot', subject: 'd', amount: 1 },
      { policy: 'hot', subject: 'd', grant: id.slice(1), amount: 1 },
      { policy: 'hot', subject: 'd', grant: `${id.slice(1)}=`, amount: 1 },
    ]) {
      const r = await post('/v1/grants/return', body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body['code']).toBe('AGT_ERR_INVALID_GRANT');
    }
    expect(
      (await post('/v1/grants/return', { policy: 'hot', subject: 'd', grant: id, amount: 1 })).body,
    ).toMatchObject({ code: 'AGT_ERR_UNKNOWN_GRANT' });
    expect((await post('/v1/grants', { policy: 'nope', subject: 'd', amount: 1 })).body['code']).toBe(
      'AGT_ERR_UNKNOWN_POLICY',
    );
    expect(
      (await post('/v1/grants', { policy: 'hot', subject: 'bad subject', amount: 1 })).body['code'],
    ).toBe('AGT_ERR_INVALID_SUBJECT');
    const d = await post('/v1/decisions', { policy: 'hot', subject: 'd' });
    expect(d.body).toMatchObject({ results: [{ remaining: 99 }] });
  });
});

describe('POST /v1/grants/batch', () => {
  type Answer = { status: number; body: Record<string, unknown> };
  const answers = (body: Record<string, unknown>, side: 'takes' | 'returns') => body[side] as Answer[];

  it('takes of many subjects in one exchange, each answered on its own; a refusal fails no other', async () => {
    const { post } = agent();
    const b = await post('/v1/grants/batch', {
      takes: [
        { policy: 'hot', subject: 'a', amount: 4 },
        { policy: 'hot', subject: 'b', amount: 50, ttlMs: 3000 },
        { policy: 'log', subject: 'a', amount: 1 },
        { policy: 'nope', subject: 'a', amount: 1 },
        { policy: 'small', subject: 'a', amount: 1 },
      ],
    });
    expect(b.status).toBe(200);
    const takes = answers(b.body, 'takes');
    expect(answers(b.body, 'returns')).toEqual([]);
    expect(takes.map((t) => t.status)).toEqual([200, 200, 400, 404, 200]);
    expect(takes[0]!.body).toMatchObject({ granted: 4, remaining: 96, expiresInMs: 1000 });
    // A tenth of the bucket at most, held as long as asked.
    expect(takes[1]!.body).toMatchObject({ granted: 10, remaining: 90, expiresInMs: 3000 });
    expect(takes[2]!.body).toMatchObject({ code: 'AGT_ERR_GRANT_NOT_ALLOWED', status: 400 });
    expect(takes[3]!.body).toMatchObject({ code: 'AGT_ERR_UNKNOWN_POLICY', status: 404 });
    expect(takes[4]!.body).toMatchObject({ granted: 1, remaining: 4 });
    expect((await post('/v1/decisions', { policy: 'hot', subject: 'a' })).body).toMatchObject({
      results: [{ remaining: 95 }],
    });
  });

  it('a batch of takes of one subject never takes more than the bucket holds', async () => {
    const { post } = agent();
    const takes = Array.from({ length: 4 }, () => ({ policy: 'small', subject: 's', amount: 1 }));
    const first = answers((await post('/v1/grants/batch', { takes })).body, 'takes');
    // A tenth of 5 is 1 token a grant: 4 takes of 1 from 5.
    expect(first.map((t) => t.body['granted'])).toEqual([1, 1, 1, 1]);
    const second = answers((await post('/v1/grants/batch', { takes })).body, 'takes');
    expect(second.map((t) => t.body['granted'])).toEqual([1, 0, 0, 0]);
    expect(second.map((t) => t.body['grant'] === null)).toEqual([false, true, true, true]);
  });

  it('returns go first and credit at most their grant, once; an unknown one is refused alone', async () => {
    const { post } = agent();
    const g = await post('/v1/grants', { policy: 'hot', subject: 'r', amount: 10 });
    const grant = g.body['grant'] as string;
    const forged = 'AAAAAAAAAAAAAAAAAAAAAA';
    const b = await post('/v1/grants/batch', {
      takes: [{ policy: 'hot', subject: 'r', amount: 10 }],
      returns: [
        { policy: 'hot', subject: 'r', grant, amount: 25 },
        { policy: 'hot', subject: 'r', grant, amount: 3 },
        { policy: 'hot', subject: 'r', grant: forged, amount: 3 },
      ],
    });
    expect(b.status).toBe(200);
    const returns = answers(b.body, 'returns');
    expect(returns[0]).toEqual({ status: 200, body: { policy: 'hot', credited: 10, dropped: 15 } });
    expect(returns.slice(1).map((r) => [r.status, r.body['code']])).toEqual([
      [404, 'AGT_ERR_UNKNOWN_GRANT'],
      [404, 'AGT_ERR_UNKNOWN_GRANT'],
    ]);
    // The return came back before the take: 100 again, then 10 taken.
    expect(answers(b.body, 'takes')[0]).toMatchObject({ status: 200, body: { granted: 10, remaining: 90 } });
  });

  it('a malformed batch is refused whole with AGT_ERR_INVALID_GRANT and changes nothing', async () => {
    const { post } = agent();
    const good = { policy: 'hot', subject: 'm', amount: 5 };
    const id = 'AAAAAAAAAAAAAAAAAAAAAA';
    for (const body of [
      {},
      { takes: [] },
      { takes: [], returns: [] },
      { takes: [good, { ...good, amount: 0 }] },
      { takes: [good, { ...good, ttlMs: 5001 }] },
      { takes: [good, { ...good, ttlMs: 99 }] },
      { takes: [good], returns: [{ policy: 'hot', subject: 'm', amount: 1 }] },
      { takes: [good], extra: 1 },
      { takes: Array.from({ length: 129 }, () => good) },
      {
        takes: Array.from({ length: 100 }, () => good),
        returns: Array.from({ length: 29 }, () => ({ ...good, grant: id })),
      },
      { decisions: [good] },
    ]) {
      const r = await post('/v1/grants/batch', body);
      expect(r.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(r.body['code']).toBe('AGT_ERR_INVALID_GRANT');
    }
    expect((await post('/v1/decisions', { policy: 'hot', subject: 'm' })).body).toMatchObject({
      results: [{ remaining: 99 }],
    });
  });
});
