/**
 * The agent's warm-up before it says ready (regional-agent/startup/warm-up.ts), in a real agent process on a Redis
 * of its own: dry-run decisions of every policy kind it serves through the batch and single routes, all decided,
 * nothing written in Redis, no decision counted, its duration in `quotaplane_warm_up_seconds`; none when
 * `QP_WARM_UP_ROUNDS` is 0.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RedisServer } from '../../harness/backend.js';
import { backend } from '../../harness/fixtures.js';
import { startAgentProcess } from '../../helpers/agent-process.js';

const POLICIES = {
  bucket: { capacity: 10, refillPerSecond: 1 },
  log: { kind: 'sliding_log', capacity: 5, windowSeconds: 60 },
  day: { kind: 'daily', capacity: 100 },
  addresses: { capacity: 20, refillPerSecond: 0.05, subjectKind: 'ip' },
};

let server: RedisServer;
let redis: Redis;

beforeAll(async () => {
  server = await backend().startRedis();
  redis = new Redis(server.url);
}, 30_000);

afterAll(async () => {
  redis?.disconnect();
  await server?.[Symbol.asyncDispose]();
});

/** The first number of the agent's `/metrics` matching `pattern`'s group, undefined when absent. */
async function metric(url: string, pattern: RegExp): Promise<number | undefined> {
  const match = pattern.exec(await (await fetch(`${url}/metrics`)).text());
  return match === null ? undefined : Number(match[1]);
}

describe('the warm-up before the agent says ready', () => {
  it('decides 8 batches of 64 dry runs (and 8 lone ones) of every kind, writing and counting nothing', async () => {
    await redis.flushall();
    await using agent = await startAgentProcess({
      redisUrl: server.url,
      policies: POLICIES,
      env: { QP_LOG_LEVEL: 'info' },
    });
    const line = agent
      .output()
      .split('\n')
      .find((l) => l.includes('warmed up'));
    expect(line, agent.output()).toBeDefined();
    expect(JSON.parse(line!)).toMatchObject({ rounds: 8, sent: 8 * 65, decided: 8 * 65 });
    expect(await metric(agent.url, /^quotaplane_warm_up_seconds (\S+)$/m)).toBeGreaterThan(0);
    // Dry runs: no key in Redis, no decision counted.
    expect(await redis.dbsize()).toBe(0);
    expect(await metric(agent.url, /^quotaplane_decisions_total\{[^}]*\} (\d+)$/m)).toBeUndefined();
    // Ready, and the first real decision is the agent's.
    const res = await fetch(`${agent.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'bucket', subject: 'first' }),
    });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ allowed: true, results: [{ remaining: 9 }] });
  });

  it('an agent allowed one decision in flight sheds none of its own warm-up', async () => {
    await redis.flushall();
    await using agent = await startAgentProcess({
      redisUrl: server.url,
      policies: POLICIES,
      env: { QP_LOG_LEVEL: 'info', QP_MAX_IN_FLIGHT: '1' },
    });
    const line = agent
      .output()
      .split('\n')
      .find((l) => l.includes('warmed up'));
    expect(line, agent.output()).toBeDefined();
    // Batches of one (a batch's decisions are admitted one by one), each followed by a lone decision.
    expect(JSON.parse(line!)).toMatchObject({ rounds: 8, sent: 8 * 2, decided: 8 * 2 });
    expect(
      await metric(
        agent.url,
        /^quotaplane_request_errors_total\{[^}]*code="AGT_ERR_OVERLOADED"[^}]*\} (\d+)$/m,
      ),
    ).toBeUndefined();
  });

  it('none with QP_WARM_UP_ROUNDS=0', async () => {
    await using agent = await startAgentProcess({
      redisUrl: server.url,
      policies: POLICIES,
      env: { QP_LOG_LEVEL: 'info', QP_WARM_UP_ROUNDS: '0' },
    });
    expect(agent.output()).not.toContain('warmed up');
    expect(await metric(agent.url, /^quotaplane_warm_up_seconds (\S+)$/m)).toBe(0);
  });
});
