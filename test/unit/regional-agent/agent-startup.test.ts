/**
 * The agent's start-up as plugins (regional-agent/app.ts): each part closes in its own `onClose`, after every part
 * that uses it, and the stores beside the buckets come from the store's `companions`, not from its class.
 */
import type { FastifyPluginAsync } from 'fastify';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../../core/clock.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import type { DecisionStore } from '../../../regional-agent/decisions/decision-store.js';
import { ModelDecisionStore } from '../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';

const config = AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' });
const policies = [parsePolicy({ name: 'hot', capacity: 100, refillPerSecond: 1e-4, maxCost: 10 })];

function agent(store: (clock: ManualClock) => DecisionStore, events: string[] = []) {
  const clock = new ManualClock(1_750_000_000_000);
  const source = new StaticPolicySource(policies);
  source.close = () => {
    events.push('policies');
    return Promise.resolve();
  };
  const resource =
    (name: string): FastifyPluginAsync =>
    (scope) => {
      scope.addHook('onClose', () => {
        events.push(name);
        return Promise.resolve();
      });
      return Promise.resolve();
    };
  return buildApp(
    {
      store: store(clock),
      policies: source,
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
      clock,
      onClose: () => {
        events.push('onClose');
        return Promise.resolve();
      },
      resources: [resource('redis'), resource('nats')],
    },
    config,
  );
}

/** The model store without its companions: a store that keeps nothing beside its buckets. */
function bare(clock: ManualClock): DecisionStore {
  const inner = new ModelDecisionStore(clock);
  return new Proxy(inner, {
    get: (target, key) => {
      if (key === 'companions') return undefined;
      const value: unknown = Reflect.get(target, key);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

describe('agent start-up', () => {
  it('closes each part after those that use it: listeners, sweep, decision core, policies, onClose, then resources last given first', async () => {
    const events: string[] = [];
    const built = agent((clock) => new ModelDecisionStore(clock), events);
    await built.ready;
    const stop = built.reservations.stop.bind(built.reservations);
    built.reservations.stop = () => {
      events.push('sweep');
      return stop();
    };
    const shutdown = built.guard.shutdown.bind(built.guard);
    built.guard.shutdown = () => {
      events.push('guard');
      shutdown();
    };
    built.attach({
      close: () => {
        events.push('grpc listener');
        return Promise.resolve();
      },
    });
    expect((await built.app.inject({ method: 'GET', url: '/readyz' })).statusCode).toBe(200);
    await built.close();
    expect(events).toEqual(['grpc listener', 'sweep', 'guard', 'policies', 'onClose', 'nats', 'redis']);
    // A second close is the first one.
    await built.close();
    expect(events).toHaveLength(7);
  });

  it('an app closed before it ever served still closes every part', async () => {
    const events: string[] = [];
    await agent((clock) => new ModelDecisionStore(clock), events).close();
    expect(events).toEqual(['policies', 'onClose', 'nats', 'redis']);
  });

  it("grants are served on a store's own buckets only: the model store keeps them, a store without companions not", async () => {
    const grant = {
      method: 'POST' as const,
      url: '/v1/grants',
      payload: { policy: 'hot', subject: 'a', amount: 5 },
    };
    const model = agent((clock) => new ModelDecisionStore(clock));
    await model.ready;
    expect((await model.app.inject(grant)).statusCode).toBe(200);
    const none = agent(bare);
    await none.ready;
    const refused = await none.app.inject(grant);
    expect([refused.statusCode, refused.json<{ code: string }>().code]).toEqual([404, 'AGT_ERR_NOT_FOUND']);
    // Reservations still work: in memory beside a store that keeps none.
    const reserved = await none.app.inject({
      method: 'POST',
      url: '/v1/reservations',
      payload: { policy: 'hot', subject: 'a', amount: 3, ttlSeconds: 60 },
    });
    expect(reserved.statusCode).toBe(200);
    expect(reserved.json<{ reservation: { amount: number } }>().reservation.amount).toBe(3);
    await Promise.all([model.close(), none.close()]);
  });
});
