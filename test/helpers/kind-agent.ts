import type { Cluster, Redis } from 'ioredis';
import type { Policy } from '../../core/policy/policy.js';
import type { ShareView } from '../../core/shares/shares.js';
import type { AgentApp } from '../../regional-agent/app.js';
import { agentOn } from './agent-fixture.js';

/**
 * An agent on a real Redis (or cluster) with static policies and shares, generous timeouts (these tests count
 * decisions, they do not time them) and the reservation sweep off unless asked for. Await `ready` before use.
 */
export function agentOnRedis(
  redis: Redis | Cluster,
  policies: readonly Policy[],
  options: { shares?: ShareView; region?: string; sweepMs?: number; random?: () => number } = {},
): AgentApp {
  return agentOn(redis, {
    policies,
    ...(options.shares === undefined ? {} : { shares: options.shares }),
    ...(options.random === undefined ? {} : { deps: { random: options.random } }),
    config: { region: options.region ?? 'us', reservationSweepMs: options.sweepMs ?? 0 },
  }).agent;
}
