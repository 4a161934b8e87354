/**
 * The agent's view of Redis TIME, on a real Redis: a sample is never later than the truth, and a sample read
 * after a long stall of this process is dropped instead of making every deadline that much early.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { AgentConfig } from '../../../../regional-agent/config.js';
import { startAgent } from '../../../../regional-agent/start.js';
import { Redis } from 'ioredis';
import {
  agentMicros,
  LINK_ROUND_TRIPS,
  MAX_SAMPLE_ROUND_TRIP_US,
  RedisClock,
} from '../../../../regional-agent/redis/redis-clock.js';
import { backend, sharedRedis } from '../../../harness/fixtures.js';
import { tcpProxy } from '../../../helpers/tcp-proxy.js';

/** Block this event loop for `ms`, as a busy start-up does. */
function stall(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until);
}

async function redisMicros(redis: Pick<Redis, 'time'>): Promise<number> {
  const [s, us] = await redis.time();
  return Number(s) * 1_000_000 + Number(us);
}

describe('RedisClock', () => {
  it('drops a sample read after a stall, and converts with a good one to at most the true Redis time', async () => {
    await using r = sharedRedis();
    await r.ping();
    const clock = new RedisClock(r, { sampleEveryMs: 3_600_000 });
    try {
      // Wait for the constructor's own samples, then start again from nothing. A sample whose round trip ran past
      // the bound is dropped (a loaded machine, a container's network): sample again until one is good, at most 20.
      await clock.sample();
      for (let i = 0; i < 20 && !clock.synced; i++) await clock.sample();
      // Its first samples (the constructor's and this one) are asked for, then this process blocks: the TIME
      // replies arrive meanwhile and are read 200 ms late, so both are dropped.
      const stalled = new RedisClock(r, { sampleEveryMs: 3_600_000 });
      try {
        const pending = stalled.sample();
        stall(200);
        await pending;
        await new Promise((resolve) => setImmediate(resolve));
        expect(stalled.toRedisMicros(agentMicros())).toBe(0);
        expect(stalled.synced).toBe(false);
      } finally {
        stalled.close();
      }

      // An unstalled sample: the converted instant is never after Redis's own clock read just afterwards, and
      // early by no more than a round trip's bound (plus the read that follows).
      const now = agentMicros();
      const converted = clock.toRedisMicros(now);
      const truth = await redisMicros(r);
      expect(converted).toBeGreaterThan(0);
      expect(clock.synced).toBe(true);
      expect(converted).toBeLessThanOrEqual(truth);
      expect(truth - converted).toBeLessThan(MAX_SAMPLE_ROUND_TRIP_US + 50_000);
    } finally {
      clock.close();
    }
  });

  it('an agent is not ready until its clock has a sample: no traffic while calls would carry no deadline', async () => {
    await using server = await backend().startRedis();
    const dir = mkdtempSync(join(tmpdir(), 'qp-clock-'));
    const file = join(dir, 'policies.json');
    writeFileSync(file, JSON.stringify({ policies: { demo: { capacity: 10, refillPerSecond: 1 } } }));
    await server.pause();
    const running = await startAgent(
      AgentConfig.parse({
        region: 'us',
        redisUrl: server.url,
        policiesFile: file,
        port: 0,
        logLevel: 'silent',
      }),
      pino({ level: 'silent' }),
    );
    try {
      const readyz = async () => {
        const r = await fetch(`${running.url}/readyz`);
        return { status: r.status, body: await r.text() };
      };
      const before = await readyz();
      expect(before.status).toBe(503);
      expect(before.body).toContain('no Redis TIME sample yet');
      await server.resume();
      await expect.poll(async () => (await readyz()).status, { timeout: 15_000 }).toBe(200);
    } finally {
      await server.resume();
      await running.agent.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a Redis farther than the bound: samples count from the third round trip, and an agent behind it gets ready and warns', async () => {
    await using server = await backend().startRedis();
    // 12 ms each way: every round trip is over MAX_SAMPLE_ROUND_TRIP_US, as to a Redis in another zone.
    await using proxy = await tcpProxy({ host: server.host, port: server.port }, { delayMs: 12 });
    const far = new Redis({ host: '127.0.0.1', port: proxy.port, lazyConnect: true });
    await far.connect();
    const clock = new RedisClock(far, { sampleEveryMs: 3_600_000 });
    try {
      for (let i = 0; i < LINK_ROUND_TRIPS - 1; i++) await clock.sample();
      // Until the link's own round trip is known, one long round trip cannot be told from a stalled event loop.
      expect(clock.linkRoundTripUs).toBeGreaterThan(MAX_SAMPLE_ROUND_TRIP_US);
      await clock.sample();
      for (let i = 0; i < 20 && !clock.synced; i++) await clock.sample();
      expect(clock.synced).toBe(true);
      const converted = clock.toRedisMicros(agentMicros());
      const near = new Redis(server.url);
      try {
        expect(converted).toBeLessThanOrEqual(await redisMicros(near));
      } finally {
        near.disconnect();
      }
    } finally {
      clock.close();
      far.disconnect();
    }

    const dir = mkdtempSync(join(tmpdir(), 'qp-clock-far-'));
    const file = join(dir, 'policies.json');
    writeFileSync(file, JSON.stringify({ policies: { demo: { capacity: 10, refillPerSecond: 1 } } }));
    const lines: string[] = [];
    const running = await startAgent(
      AgentConfig.parse({
        region: 'us',
        redisUrl: `redis://127.0.0.1:${proxy.port}`,
        policiesFile: file,
        port: 0,
        logLevel: 'warn',
        storeTimeoutMs: 60,
      }),
      pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) }),
    );
    try {
      // Before: every sample was dropped, and the agent said "no Redis TIME sample yet" for good.
      await expect
        .poll(async () => (await fetch(`${running.url}/readyz`)).status, { timeout: 20_000 })
        .toBe(200);
      const warning = lines
        .map(
          (line) => JSON.parse(line) as { msg: string; storeTimeoutMs?: number; redisRoundTripMs?: number },
        )
        .find((entry) => entry.storeTimeoutMs !== undefined);
      expect(warning?.msg).toMatch(
        /^Redis answers in [\d.]+ ms, more than a third of QP_STORE_TIMEOUT_MS \(60\)/,
      );
      expect(warning?.redisRoundTripMs).toBeGreaterThanOrEqual(24);
    } finally {
      await running.agent.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
