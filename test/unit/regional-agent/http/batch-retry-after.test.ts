/**
 * A shed element of `POST /v1/decisions/batch` carries the retry hint its own `POST /v1/decisions` would have
 * carried as `Retry-After` (QP_OVERLOAD_RETRY_AFTER_MS in whole seconds, rounded up): `retryAfter` in its answer,
 * whether admission control shed it here or a strict policy's home region shed it. Nothing else carries one.
 */
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { BatchResponse } from '../../../../core/wire/batch.js';
import { buildApp, type AgentApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { HomeOverloadedError, type Forwarder } from '../../../../regional-agent/decisions/forwarder.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';

let built: AgentApp | undefined;
afterEach(async () => {
  await built?.app.close();
  built = undefined;
});

const policies = [
  parsePolicy({ name: 'p', capacity: 100, refillPerSecond: 1 }),
  parsePolicy({ name: 'away', capacity: 100, refillPerSecond: 1, mode: 'strict', homeRegion: 'eu' }),
];

/** A home region that sheds every forwarded request (its admission control refused it). */
const sheddingHome: Forwarder = {
  decide: (home) =>
    Promise.reject(new HomeOverloadedError(home, 'home_admission', `home region ${home}: busy`)),
};

async function agent(config: Record<string, unknown>): Promise<AgentApp> {
  const clock = new ManualClock(1_750_000_000_000);
  built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource(policies),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      forwarder: sheddingHome,
    },
    AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused', ...config }),
  );
  await built.app.ready();
  return built;
}

async function batch(app: AgentApp['app'], decisions: unknown[]) {
  const res = await app.inject({ method: 'POST', url: '/v1/decisions/batch', payload: { decisions } });
  expect(res.statusCode, res.body).toBe(200);
  return { answers: BatchResponse.parse(res.json()).answers, raw: res.json<{ answers: object[] }>().answers };
}

describe('the retry hint of a shed batch element', () => {
  it('admission control: every element shed beyond maxInFlight carries retryAfter, the decided ones none', async () => {
    const { app } = await agent({ maxInFlight: 2, overloadRetryAfterMs: 10_000 });
    const { answers, raw } = await batch(
      app,
      Array.from({ length: 8 }, () => ({ policy: 'p', subject: 's' })),
    );
    expect(answers.map((a) => a.status)).toEqual([200, 200, 503, 503, 503, 503, 503, 503]);
    for (const a of raw.slice(0, 2)) expect(a).not.toHaveProperty('retryAfter');
    for (const a of raw.slice(2)) {
      expect(a).toMatchObject({
        status: 503,
        retryAfter: 10,
        body: { code: 'AGT_ERR_OVERLOADED', shed: 'admission' },
      });
      // In that order: the status, the hint, then the problem.
      expect(Object.keys(a)).toEqual(['status', 'retryAfter', 'body']);
    }
  });

  it("a strict policy's home that sheds: the element carries what the single route sends as Retry-After", async () => {
    for (const [ms, seconds] of [
      [10_000, 10],
      [1500, 2],
      [1, 1],
    ] as const) {
      const { app } = await agent({ overloadRetryAfterMs: ms });
      const single = await app.inject({
        method: 'POST',
        url: '/v1/decisions',
        payload: { policy: 'away', subject: 's' },
      });
      expect(single.statusCode).toBe(503);
      expect(single.json()).toMatchObject({ code: 'AGT_ERR_OVERLOADED', shed: 'home_admission' });
      expect(single.headers['retry-after']).toBe(String(seconds));
      const { raw } = await batch(app, [
        { policy: 'p', subject: 's' },
        { policy: 'away', subject: 's' },
        { policy: 'no-such-policy', subject: 's' },
      ]);
      expect(raw[0]).toMatchObject({ status: 200 });
      expect(raw[0]).not.toHaveProperty('retryAfter');
      expect(raw[1]).toMatchObject({
        status: 503,
        retryAfter: seconds,
        body: { code: 'AGT_ERR_OVERLOADED', shed: 'home_admission' },
      });
      // A refusal carries none, as its single route sends no Retry-After.
      expect(raw[2]).toMatchObject({ status: 404, body: { code: 'AGT_ERR_UNKNOWN_POLICY' } });
      expect(raw[2]).not.toHaveProperty('retryAfter');
      await app.close();
      built = undefined;
    }
  });
});
