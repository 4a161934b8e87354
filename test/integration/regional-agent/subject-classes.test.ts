import { agentOnRedis } from '../../helpers/agent-fixture.js';
import type { Cluster, Redis } from 'ioredis';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { connectRedis, whenReady } from '../../../regional-agent/redis/connect.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';

/** Subjects the policy names: fresh each run, so every bucket starts full. */
const big = uniquePrefix('tenant-big');
const api = parsePolicy({
  name: 'api',
  capacity: 10,
  refillPerSecond: 1e-4,
  classes: { enterprise: { capacity: 100, refillPerSecond: 1e-3 } },
  subjects: { [big]: 'enterprise' },
});

async function agentOn(redis: Redis | Cluster, share: number): Promise<AgentApp> {
  const agent = agentOnRedis(redis, [api], { shares: new StaticShareView({ api: share }) });
  await agent.ready;
  return agent;
}

async function race(agent: AgentApp, body: object, n: number): Promise<number> {
  const all = await Promise.all(
    Array.from({ length: n }, async () => {
      const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
      return DecisionResponse.parse(res.json()).allowed;
    }),
  );
  return all.filter(Boolean).length;
}

const redis = sharedRedis();
afterAll(() => redis.disconnect());

describe('subject classes on a real Redis: exact per class', () => {
  it('500 racing callers each: a tenant the policy names enterprise gets exactly 100, a default tenant exactly 10, a tenant whose caller names the class exactly 100', async () => {
    const agent = await agentOn(redis, 1);
    try {
      // One race at a time: 1500 at once would meet the agent's admission control (QP_MAX_IN_FLIGHT).
      const named = await race(agent, { policy: 'api', subject: big }, 500);
      const plain = await race(agent, { policy: 'api', subject: uniquePrefix('tenant-small') }, 500);
      const asked = await race(
        agent,
        { policy: 'api', subject: uniquePrefix('tenant-asks'), class: 'enterprise' },
        500,
      );
      expect(named).toBe(100);
      expect(plain).toBe(10);
      expect(asked).toBe(100);
    } finally {
      await agent.app.close();
    }
  });
});

describe('subject classes on a real 3-master Redis Cluster', () => {
  it("a class's bucket is sized by the region's share: 0.3 of 100 admits exactly 30", async () => {
    const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
    const cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
    cluster.on('error', () => undefined);
    await whenReady(cluster, 10_000);
    const agent = await agentOn(cluster, 0.3);
    try {
      const subject = uniquePrefix('tenant');
      expect(await race(agent, { policy: 'api', subject, class: 'enterprise' }, 500)).toBe(30);
      expect(await race(agent, { policy: 'api', subject: uniquePrefix('other') }, 500)).toBe(3);
    } finally {
      await agent.app.close();
      cluster.disconnect();
    }
  });
});
