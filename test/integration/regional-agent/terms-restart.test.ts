/**
 * A restart and a predecessor's terms, on a real Redis with a coordinator: every term's end is recorded under the
 * agent's instance before it is answered (lua/terms_until.lua), and a starting agent waits for what its instance
 * recorded before its first heartbeat (regional-agent/terms/terms-until.ts); with nothing recorded, not at all.
 */
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { termsUntilKey } from '../../../core/keys.js';
import { TermResponse } from '../../../core/wire/term.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { RedisTermsUntil } from '../../../regional-agent/redis/terms-until-store.js';
import { startAgent } from '../../../regional-agent/start.js';
import { predecessorTermsOver } from '../../../regional-agent/terms/terms-until.js';
import { startStack, type ServiceStack } from '../../helpers/fixture/index.js';
import { eventually } from '../../helpers/wait.js';

const WAITING = /waiting \d+ ms for a predecessor's terms/;

let stack: ServiceStack;
let redis: Redis;
const logs: string[] = [];

beforeAll(async () => {
  stack = await startStack({
    regions: ['us'],
    agentsPerRegion: 1,
    agent: { terms: 'on', termMs: 2000, decisionDeadlineMs: 2000, storeTimeoutMs: 2000 },
    log: pino({ level: 'info' }, { write: (line: string) => void logs.push(line) }),
  });
  await stack.putPolicy('direct', { capacity: 100, refillPerSecond: 1 });
  await stack.ready(['direct']);
  redis = new Redis(stack.region('us').redis.url);
}, 60_000);

afterAll(async () => {
  redis?.disconnect();
  await stack?.[Symbol.asyncDispose]();
});

const agent = () => stack.inRegion('us')[0]!;

async function term(): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${agent().url}/v1/terms`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ policy: 'direct' }),
  });
  return { status: res.status, body: await res.json() };
}

async function metric(url: string, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(pattern.exec(text)?.[1] ?? 0);
}

const HEARTBEATS = /^quotaplane_agent_heartbeats_total\{[^}]*outcome="renewed"[^}]*\} (\S+)$/m;

describe('terms across a restart, on a real Redis', () => {
  it('an agent whose instance never gave a term starts without waiting: nothing recorded, nothing logged, leased', async () => {
    const key = termsUntilKey(agent().instance);
    expect(await redis.exists(key)).toBe(0);
    expect(logs.filter((l) => WAITING.test(l))).toEqual([]);
    expect(await metric(agent().url, HEARTBEATS)).toBeGreaterThan(0);
  });

  it('a term records a key covering its deadline, expiring after it; a shorter instant never lowers it', async () => {
    const answer = await term();
    expect(answer.status).toBe(200);
    const t = TermResponse.parse(answer.body);
    const key = termsUntilKey(agent().instance);
    const recorded = Number(await redis.get(key));
    expect(recorded).toBeGreaterThanOrEqual(t.deadlineMicros + 20_000);
    expect(await redis.pttl(key)).toBeGreaterThan(0);
    const store = new RedisTermsUntil(redis, { instance: agent().instance, timeoutMs: 2000 });
    await store.write(recorded - 1_000_000);
    expect(Number(await redis.get(key))).toBe(recorded);
    // A successor under this instance reads it, and would wait for it (its own clock is not asked: Redis's).
    const waits: number[] = [];
    await predecessorTermsOver({
      store,
      log: pino({ level: 'silent' }),
      sleep: () => Promise.resolve(),
      onWait: (ms) => void waits.push(ms),
    });
    const [seconds, micros] = await redis.time();
    const left = recorded - (Number(seconds) * 1_000_000 + Number(micros));
    expect(waits).toHaveLength(1);
    if (left > 0) expect(waits[0]).toBeGreaterThanOrEqual(Math.ceil(left / 1000));
  });

  it('a record that cannot be written refuses the term (503 AGT_ERR_TERM_UNAVAILABLE) and changes nothing', async () => {
    const key = termsUntilKey(agent().instance);
    const url = agent().url;
    const issued = /quotaplane_terms_total\{[^}]*outcome="issued"[^}]*\} (\S+)/;
    const unavailable = /quotaplane_terms_total\{[^}]*outcome="unavailable"[^}]*\} (\S+)/;
    const before = { issued: await metric(url, issued), unavailable: await metric(url, unavailable) };
    // The agent writes only an instant above the one it last wrote: a term ending before the earlier tests' record
    // (a lease with less left than a term) would need no write. Past that record, every term needs one.
    const prior = Number((await redis.get(key)) ?? 0);
    for (;;) {
      const [seconds, micros] = await redis.time();
      if (Number(seconds) * 1_000_000 + Number(micros) > prior) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // A key of another type: the script's GET fails (WRONGTYPE), as any failed write would.
    await redis.del(key);
    await redis.hset(key, 'not', 'a string');
    const refused = await term();
    expect(refused.status).toBe(503);
    expect(refused.body).toMatchObject({ code: 'AGT_ERR_TERM_UNAVAILABLE' });
    expect(String((refused.body as { detail: string }).detail)).toContain('could not be recorded in Redis');
    expect(await redis.hgetall(key)).toEqual({ not: 'a string' });
    expect({ issued: await metric(url, issued), unavailable: await metric(url, unavailable) }).toEqual({
      issued: before.issued,
      unavailable: before.unavailable + 1,
    });
    await redis.del(key);
    expect((await term()).status).toBe(200);
  });

  it("a successor holds its first heartbeat until its instance's recorded instant has passed in Redis time", async () => {
    const instance = `us-successor-${process.pid}`;
    // What a predecessor killed mid-term leaves: an instant 1.5 s ahead of Redis time.
    const [seconds, micros] = await redis.time();
    const until = Number(seconds) * 1_000_000 + Number(micros) + 1_500_000;
    await new RedisTermsUntil(redis, { instance, timeoutMs: 2000 }).write(until);
    const successorLogs: string[] = [];
    const successor = await startAgent(
      AgentConfig.parse({
        region: 'us',
        redisUrl: stack.region('us').redis.url,
        natsUrl: [stack.region('us').natsUrl],
        kvNamespace: stack.namespace,
        instance,
        port: 0,
        terms: 'on',
      }),
      pino({ level: 'info' }, { write: (line: string) => void successorLogs.push(line) }),
    );
    try {
      await eventually(
        async () => (await metric(successor.url, HEARTBEATS)) > 0,
        15_000,
        'a renewal of the successor',
      );
      // Renewed means a heartbeat was sent and answered: after the recorded instant.
      const [s, us] = await redis.time();
      expect(Number(s) * 1_000_000 + Number(us)).toBeGreaterThan(until);
      const waited = successorLogs
        .map((l) => JSON.parse(l) as { msg: string; waitMs?: number })
        .filter((l) => WAITING.test(l.msg));
      expect(waited).toHaveLength(1);
      expect(waited[0]!.waitMs).toBeGreaterThan(0);
      expect(waited[0]!.waitMs).toBeLessThanOrEqual(1_520);
    } finally {
      await successor.agent.close();
    }
  }, 30_000);
});
