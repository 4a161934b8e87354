/**
 * Every answer of the decision routes says how long the agent may take to answer a decision
 * (`quotaplane-answer-within-ms`): its decision deadline plus the allowance of the farthest link its forwarder
 * knows, the homes of its strict policies included before they answer. A client's timeout below it gives up on
 * decisions the agent still makes and charges.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock } from '../../../../core/clock.js';
import { parsePolicy, type Policy } from '../../../../core/policy/policy.js';
import { StaticShareView } from '../../../../core/shares/shares.js';
import { ANSWER_WITHIN_HEADER } from '../../../../core/wire/agent.js';
import { buildApp, type AgentApp } from '../../../../regional-agent/app.js';
import { AgentConfig } from '../../../../regional-agent/config.js';
import type { Forwarder } from '../../../../regional-agent/decisions/forwarder.js';
import { ModelDecisionStore } from '../../../../regional-agent/decisions/model-decision-store.js';
import type { PolicySource } from '../../../../regional-agent/policies/policy-source.js';
import { StaticPolicySource } from '../../../../regional-agent/policies/static-policy-source.js';
import { NatsForwarder } from '../../../../regional-agent/strict/nats-forwarder.js';

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

const p = parsePolicy({ name: 'p', capacity: 10, refillPerSecond: 1 });

async function agent(
  forwarder?: Forwarder,
  policies: PolicySource = new StaticPolicySource([p]),
): Promise<AgentApp> {
  const clock = new ManualClock(1_750_000_000_000);
  built = buildApp(
    {
      store: new ModelDecisionStore(clock),
      policies,
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

/** Policies that change when told (as the coordinator's KV bucket does). */
class ChangingPolicies implements PolicySource {
  #policies: ReadonlyMap<string, Policy>;
  readonly #listeners = new Set<(policies: ReadonlyMap<string, Policy>) => void>();
  constructor(policies: readonly Policy[]) {
    this.#policies = new Map(policies.map((x) => [x.name, x]));
  }
  set(policies: readonly Policy[]): void {
    this.#policies = new Map(policies.map((x) => [x.name, x]));
    for (const listener of this.#listeners) listener(this.#policies);
  }
  current(): ReadonlyMap<string, Policy> {
    return this.#policies;
  }
  ready(): Promise<void> {
    return Promise.resolve();
  }
  onChange(listener: (policies: ReadonlyMap<string, Policy>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
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

  it('counts the homes of its strict policies before they answer, and follows policy changes', async () => {
    // No round trips configured: a home not measured yet is waited for 250 + 1.25 × 250 = 563 ms.
    const forwarder = new NatsForwarder({ nc: {} as NatsConnection, region: 'us' });
    const strict = (name: string, homeRegion: string) =>
      parsePolicy({ name, mode: 'strict', homeRegion, capacity: 10, refillPerSecond: 1 });
    const policies = new ChangingPolicies([p, strict('own', 'us')]);
    const { app } = await agent(forwarder, policies);
    // Strict policies homed here only: nothing is forwarded, the deadline alone.
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('250');
    policies.set([p, strict('own', 'us'), strict('pay', 'eu')]);
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('563');
    expect((await app.inject(batch)).headers[ANSWER_WITHIN_HEADER]).toBe('563');
    policies.set([p]);
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('250');
  });

  it('counts them from the first answer when the policies are there at start', async () => {
    const forwarder = new NatsForwarder({ nc: {} as NatsConnection, region: 'us' });
    const pay = parsePolicy({
      name: 'pay',
      mode: 'strict',
      homeRegion: 'ap',
      capacity: 10,
      refillPerSecond: 1,
    });
    const { app } = await agent(forwarder, new StaticPolicySource([p, pay]));
    expect((await app.inject(single)).headers[ANSWER_WITHIN_HEADER]).toBe('563');
  });
});
