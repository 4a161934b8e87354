/**
 * Added latency of strict mode: a strict policy homed in `us`, decided through an agent in `us` (local) and
 * through an agent in `eu` (forwarded over NATS request/reply to the home's queue group), sequential requests
 * over HTTP on loopback, alternating rounds. Reports p50 and p99 of both and the difference.
 */
import { pino } from 'pino';
import { protocolEngine } from '../coordinator/protocol/protocol-engine.js';
import { grantsFromConfig } from '../coordinator/auth/tokens.js';
import { startCoordinator } from '../coordinator/server.js';
import { AgentConfig } from '../regional-agent/config.js';
import { startAgent } from '../regional-agent/start.js';
import { processBackend } from '../test/harness/process-backend.js';
import type { BenchSuite } from './lib.js';

const TOKEN = 'bench-admin-token-0123456789';

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

export const strictSuite: BenchSuite = {
  name: 'strict',
  async run({ seconds, rounds }, progress) {
    await using nats = await processBackend.startNats({ jetstream: true });
    await using redisUs = await processBackend.startRedis();
    await using redisEu = await processBackend.startRedis();
    const namespace = 'bench';
    const coordinator = await startCoordinator(
      {
        natsServers: [nats.url],
        regions: ['us', 'eu'],
        tokens: grantsFromConfig(TOKEN, undefined),
        metricsAuth: 'none',
        metricsListener: undefined,
        auditRefusals: { windowMs: 10_000, perMinute: 60 },
        host: '127.0.0.1',
        port: 0,
        logLevel: 'silent',
        kvNamespace: namespace,
        natsTimeoutMs: 2000,
        maxPolicies: 10,
        bodyLimitBytes: 16_384,
        audit: { maxRecords: 1000, maxAgeDays: 1, maxBytes: 8 * 1_048_576 },
        shutdownGraceMs: 0,
        protocol: { rebalance: { roundMs: 1000 }, lease: {}, safeShares: undefined },
      },
      { engine: protocolEngine() },
    );
    const agents = await Promise.all(
      [
        ['us', redisUs.url],
        ['eu', redisEu.url],
      ].map(([region, redisUrl]) =>
        startAgent(
          AgentConfig.parse({
            region,
            redisUrl,
            natsUrl: [nats.url],
            kvNamespace: namespace,
            port: 0,
            logLevel: 'silent',
          }),
          pino({ level: 'silent' }),
        ),
      ),
    );
    try {
      const put = await fetch(`${coordinator.url}/v1/policies/payments`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ mode: 'strict', homeRegion: 'us', capacity: 1e6, refillPerSecond: 1e5 }),
      });
      if (put.status >= 300) throw new Error(`PUT policy: ${put.status}`);
      for (const a of agents) {
        for (let i = 0; ; i++) {
          if ((await fetch(`${a.url}/readyz`)).status === 200) break;
          if (i > 400) throw new Error(`agent ${a.url} never became ready`);
          await new Promise((r) => setTimeout(r, 50));
        }
      }
      const [us, eu] = agents as [(typeof agents)[0], (typeof agents)[0]];
      let n = 0;
      const once = async (url: string) => {
        const started = performance.now();
        const res = await fetch(`${url}/v1/decisions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ policy: 'payments', subject: `acct-${n++ % 1000}` }),
        });
        const body = (await res.json()) as { allowed: boolean; results: { reason?: string }[] };
        const took = performance.now() - started;
        // A degraded answer (the home did not answer within the 50 ms deadline) is counted, not timed.
        if (!body.allowed || body.results[0]!.reason !== undefined) {
          degraded++;
          return undefined;
        }
        return took;
      };
      let degraded = 0;
      const local: number[] = [];
      const forwarded: number[] = [];
      for (let i = 0; i < 500; i++) {
        await once(us.url);
        await once(eu.url);
      }
      degraded = 0;
      for (let r = 0; r < rounds; r++) {
        for (const [url, into] of (r % 2 === 0
          ? [
              [us.url, local],
              [eu.url, forwarded],
            ]
          : [
              [eu.url, forwarded],
              [us.url, local],
            ]) as [string, number[]][]) {
          const end = performance.now() + (seconds * 1000) / 2;
          while (performance.now() < end) {
            const took = await once(url);
            if (took !== undefined) into.push(took);
          }
        }
        progress(`  round ${r + 1}/${rounds}: ${local.length} local, ${forwarded.length} forwarded`);
      }
      local.sort((a, b) => a - b);
      forwarded.sort((a, b) => a - b);
      const f = (x: number) => Number(x.toFixed(2));
      const p50 = { local: percentile(local, 0.5), forwarded: percentile(forwarded, 0.5) };
      const p99 = { local: percentile(local, 0.99), forwarded: percentile(forwarded, 0.99) };
      return [
        {
          bench: 'strict forwarded decision p50 ms (HTTP, loopback)',
          ours: f(p50.forwarded),
          peer: 'same decision at the home agent',
          peerValue: f(p50.local),
          ratio: f(p50.local / p50.forwarded),
          details: { addedP50Ms: f(p50.forwarded - p50.local), samples: forwarded.length, degraded },
        },
        {
          bench: 'strict forwarded decision p99 ms (HTTP, loopback)',
          ours: f(p99.forwarded),
          peer: 'same decision at the home agent',
          peerValue: f(p99.local),
          ratio: f(p99.local / p99.forwarded),
          details: { addedP99Ms: f(p99.forwarded - p99.local), samples: local.length },
        },
      ];
    } finally {
      for (const a of agents) await a.agent.close();
      await coordinator.stop();
    }
  },
};
