import type { Cluster, Redis } from 'ioredis';
import { pino } from 'pino';
import type { Policy } from '../../core/policy.js';
import { StaticShareView, type ShareView } from '../../core/shares.js';
import { buildApp, type AgentApp } from '../../regional-agent/app.js';
import { AgentConfig } from '../../regional-agent/config.js';
import { StaticPolicySource } from '../../regional-agent/policies/static-policy-source.js';
import { RedisDecisionStore } from '../../regional-agent/redis/decision-store.js';

/**
 * An agent on a real Redis (or cluster) with static policies and shares, generous timeouts (these tests count
 * decisions, they do not time them) and the reservation sweep off unless asked for. Await `ready` before use.
 */
export function agentOnRedis(
  redis: Redis | Cluster,
  policies: readonly Policy[],
  options: { shares?: ShareView; region?: string; sweepMs?: number; random?: () => number } = {},
): AgentApp {
  return buildApp(
    {
      store: new RedisDecisionStore(redis, { timeoutMs: 2000 }),
      policies: new StaticPolicySource([...policies]),
      shares: options.shares ?? new StaticShareView(),
      log: pino({ level: 'silent' }),
      ...(options.random === undefined ? {} : { random: options.random }),
    },
    AgentConfig.parse({
      region: options.region ?? 'us',
      redisUrl: 'redis://unused',
      policiesFile: 'unused',
      decisionDeadlineMs: 2000,
      storeTimeoutMs: 2000,
      reservationSweepMs: options.sweepMs ?? 0,
    }),
  );
}
