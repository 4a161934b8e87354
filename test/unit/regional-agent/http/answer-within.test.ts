/**
 * Every answer of the decision routes says how long the agent may take to answer a decision
 * (`quotaplane-answer-within-ms`): its decision deadline plus the allowance of the farthest link its forwarder
 * knows. A client's timeout below it gives up on decisions the agent still makes and charges.
 */
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { ANSWER_WITHIN_HEADER } from '../../../../core/wire/agent.js';
import { buildApp, type AgentApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import type { Forwarder } from '../../../../regional-agent/decisions/forwarder.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';

const config = AgentConfig.parse({
  region: 'us',
  redisUrl: 'redis://127.0.0.1:1',
  policiesFile: 'unused',
  decisionDeadlineMs: 250,
});
let built: AgentApp | undefined;
afterEach(async () => {
  await built?.app.close();
  built = undefined;
});

async function agent(forwarder?: Forwarder): Promise<AgentApp> {
  const clock = new ManualClock(1_750_000_000_000);
  built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies: new StaticPolicySource([parsePolicy({ name: 'p', capacity: 10, refillPerSecond: 1 })]),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      ...(forwarder === undefined ? {} : { forwarder }),
    },
    config,
  );
  await built.app.ready();
  return built;
}

/** A forwarder that knows a farthest link whose allowance is `allowance` ms (it is never asked to decide here). */
function farthest(allowance: () => number): Forwarder {
  return { decide: () => Promise.reject(new Error('not asked')), farthestAllowanceMs: allowance };
}

const single = { method: 'POST', url: '/v1/decisions', payload: { policy: 'p', subject: 's' } } as const;
const batch = {
  method: 'POST',
  url: '/v1/decisions/batch',
  payload: { decisions: [{ policy: 'p', subject: 's' }] },
} as const;

describe('quotaplane-answer-within-ms', () => {
  it('is the decision deadline alone when no link is known', async () => {
    const { app } = await agent();
    for (const call of [single, batch]) {
      const res = await app.inject(call);
      expect(res.statusCode).toBe(200);
      expect(res.headers[ANSWER_WITHIN_HEADER]).toBe('250');
    }
  });

  it("adds the farthest link's allowance, and follows it as the forwarder learns", async () => {
    let allowance = 275;
    const { app } = await agent(farthest(() => allowance));
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('525');
    expect((await app.inject(batch)).headers[ANSWER_WITHIN_HEADER]).toBe('525');
    allowance = 188;
    expect((await app.inject(batch)).headers[ANSWER_WITHIN_HEADER]).toBe('438');
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('438');
    allowance = 0;
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('250');
    allowance = 275;
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('525');
  });

  it('is on refusals of the decision routes too, and not on health routes', async () => {
    const { app } = await agent(farthest(() => 275));
    const bad = await app.inject({ method: 'POST', url: '/v1/decisions', payload: { policy: 'p' } });
    expect(bad.statusCode).toBe(400);
    expect(bad.headers[ANSWER_WITHIN_HEADER]).toBe('525');
    expect(
      (await app.inject({ method: 'GET', url: '/healthz' })).headers[ANSWER_WITHIN_HEADER],
    ).toBeUndefined();
  });
});
