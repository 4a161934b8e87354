/**
 * `POST /v1/decisions/batch` on a real Redis of its own (so its command counts are the batch's alone): exact
 * counts through the batch (a bucket of 100 asked 128 times admits 100), one script call for a batch on one
 * Redis, elements independent of each other (a bad element is its own 4xx, the others are decided and charged),
 * layered checks of one element all-or-nothing, a batch above the bound refused whole with nothing charged, and
 * admission control counting every element.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Problem } from '../../../../core/wire/agent.js';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { BatchResponse, MAX_DECISIONS_PER_BATCH } from '../../../../core/wire/batch.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'hundred', capacity: 100, refillPerSecond: 0.001 }),
  parsePolicy({ name: 'wide', capacity: 1000, refillPerSecond: 0.001, maxCost: 5 }),
];

let fixture: AgentFixture;
let tightFixture: AgentFixture;
let redis: Redis;
let agent: AgentApp;
let tight: AgentApp;

beforeAll(async () => {
  // A Redis of its own, so its command counts are the batch's alone; both agents share one client of it.
  fixture = await agentFixture({
    policies,
    redis: 'own',
    config: { reservationSweepMs: 0, maxInFlight: 1024 },
  });
  redis = fixture.redis as Redis;
  tightFixture = await agentFixture({
    policies,
    redis: { client: redis },
    config: { reservationSweepMs: 0, maxInFlight: 4 },
  });
  ({ agent } = fixture);
  ({ agent: tight } = tightFixture);
}, 30_000);

afterAll(async () => {
  await tightFixture?.[Symbol.asyncDispose]();
  await fixture?.[Symbol.asyncDispose]();
});

async function batch(on: AgentApp, decisions: unknown[]) {
  const res = await on.app.inject({ method: 'POST', url: '/v1/decisions/batch', payload: { decisions } });
  expect(res.statusCode, res.body).toBe(200);
  return BatchResponse.parse(res.json()).answers;
}

/** Whole tokens the bucket holds now. */
async function remaining(policy: string, subject: string): Promise<number> {
  const res = await agent.app.inject({
    method: 'POST',
    url: '/v1/decisions',
    payload: { policy, subject, dryRun: true },
  });
  // A dry run that fits reports what would be left after it: add its token back.
  const d = DecisionResponse.parse(res.json());
  return d.results[0]!.remaining + (d.allowed ? 1 : 0);
}

/** EVALSHA and EVAL calls Redis has run so far. */
async function scriptCalls(): Promise<number> {
  const info = await redis.info('commandstats');
  let calls = 0;
  for (const m of info.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+)/gm)) calls += Number(m[1]);
  return calls;
}

describe('POST /v1/decisions/batch', () => {
  it('admits exactly the bucket through one batch: 128 asks of a bucket of 100 admit 100', async () => {
    const subject = uniquePrefix('race');
    const answers = await batch(
      agent,
      Array.from({ length: MAX_DECISIONS_PER_BATCH }, () => ({ policy: 'hundred', subject })),
    );
    expect(answers).toHaveLength(128);
    const allowed = answers.filter((a) => a.status === 200 && a.body.allowed).length;
    const denied = answers.filter((a) => a.status === 200 && !a.body.allowed);
    expect(allowed).toBe(100);
    expect(denied).toHaveLength(28);
    for (const d of denied) {
      expect(d.body).toMatchObject({ results: [{ reason: 'subject_exhausted', remaining: 0 }] });
    }
    expect(await remaining('hundred', subject)).toBe(0);
  });

  it('sends a batch of independent subjects to Redis as one script call', async () => {
    const prefix = uniquePrefix('one-call');
    await batch(agent, [{ policy: 'wide', subject: `${prefix}-warm`, dryRun: true }]);
    const before = await scriptCalls();
    const answers = await batch(
      agent,
      Array.from({ length: 60 }, (_, i) => ({ policy: 'wide', subject: `${prefix}-${i}` })),
    );
    expect(answers.every((a) => a.status === 200 && a.body.allowed)).toBe(true);
    expect((await scriptCalls()) - before).toBe(1);
  });

  it('answers each bad element with its own 4xx and decides the others', async () => {
    const s = uniquePrefix('mixed');
    const answers = await batch(agent, [
      { policy: 'wide', subject: s, cost: 2 },
      { policy: 'nope', subject: s },
      { policy: 'wide', subject: 'has spaces' },
      { policy: 'wide', subject: s, cost: 6 },
      { policy: 'wide', subject: s, extra: true },
      'not a decision',
      { policy: 'wide', subject: s, cost: 3 },
    ]);
    expect(answers.map((a) => a.status)).toEqual([200, 404, 400, 400, 400, 400, 200]);
    expect(answers.map((a) => (a.status === 200 ? a.body.allowed : (a.body as Problem).code))).toEqual([
      true,
      'AGT_ERR_UNKNOWN_POLICY',
      'AGT_ERR_INVALID_SUBJECT',
      'AGT_ERR_COST_ABOVE_MAX',
      'AGT_ERR_INVALID_REQUEST',
      'AGT_ERR_INVALID_REQUEST',
      true,
    ]);
    // The two good elements were charged, and nothing else.
    expect(await remaining('wide', s)).toBe(1000 - 5);
  });

  it('keeps the layered checks of one element all-or-nothing, and elements independent', async () => {
    const s = uniquePrefix('layered');
    await batch(
      agent,
      Array.from({ length: 100 }, () => ({ policy: 'hundred', subject: s })),
    );
    const answers = await batch(agent, [
      {
        checks: [
          { policy: 'wide', subject: s },
          { policy: 'hundred', subject: s },
        ],
      },
      { policy: 'wide', subject: s },
    ]);
    expect(answers[0]).toMatchObject({ status: 200, body: { allowed: false } });
    expect(answers[1]).toMatchObject({ status: 200, body: { allowed: true } });
    // The denied layered element charged nothing of `wide`; the independent one charged its token.
    expect(await remaining('wide', s)).toBe(999);
  });

  it('refuses a batch above the bound whole, charging nothing, and a malformed batch', async () => {
    const s = uniquePrefix('big');
    const tooMany = await agent.app.inject({
      method: 'POST',
      url: '/v1/decisions/batch',
      payload: { decisions: Array.from({ length: 129 }, () => ({ policy: 'wide', subject: s })) },
    });
    expect(tooMany.statusCode).toBe(400);
    expect(tooMany.json()).toMatchObject({ code: 'AGT_ERR_BATCH_TOO_LARGE' });
    expect(await remaining('wide', s)).toBe(1000);
    for (const payload of [{ decisions: [] }, { decisions: 'x' }, [{ policy: 'wide', subject: s }], {}]) {
      const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions/batch', payload });
      expect(res.statusCode, JSON.stringify(payload)).toBe(400);
      expect(res.json()).toMatchObject({ code: 'AGT_ERR_INVALID_REQUEST' });
    }
    const notJson = await agent.app.inject({
      method: 'POST',
      url: '/v1/decisions/batch',
      headers: { 'content-type': 'application/json' },
      payload: '{"decisions": [',
    });
    expect(notJson.json()).toMatchObject({ code: 'AGT_ERR_MALFORMED_JSON' });
    expect(await remaining('wide', s)).toBe(1000);
  });

  it('admits every element through admission control: beyond maxInFlight an element is shed on its own', async () => {
    const s = uniquePrefix('admission');
    const answers = await batch(
      tight,
      Array.from({ length: 10 }, () => ({ policy: 'wide', subject: s })),
    );
    expect(answers.filter((a) => a.status === 200 && a.body.allowed)).toHaveLength(4);
    const shed = answers.filter((a) => a.status === 503);
    expect(shed).toHaveLength(6);
    // Each with the Retry-After its own request would carry (QP_OVERLOAD_RETRY_AFTER_MS, 1 s by default).
    for (const a of shed) expect(a).toMatchObject({ retryAfter: 1, body: { code: 'AGT_ERR_OVERLOADED' } });
    expect(await remaining('wide', s)).toBe(996);
    const metrics = (await tight.app.inject({ url: '/metrics' })).body;
    expect(metrics).toMatch(/quotaplane_shed_decisions_total\{[^}]*route="http"[^}]*\} 6/);
  });
});
