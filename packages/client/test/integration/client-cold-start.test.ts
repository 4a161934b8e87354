/**
 * The first traffic a service and a freshly started agent see: a burst of 2,000 concurrent requests over 2,000
 * new subjects, through a Fastify service protected by the plugin with default options (the 300 ms timeout
 * included), answers every request as the agent decided (never LIMITER_UNAVAILABLE), and the agent counts
 * exactly as many admissions. The service is busiest exactly then (accepting the burst while its client opens
 * its first connections to the agent): the time this process takes to get to a new connection is not the
 * agent's, and the timeout runs from the write, while a connection the agent never makes still fails.
 */
import { execFile, spawn } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { availableParallelism, loadavg } from 'node:os';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import Fastify from 'fastify';
import type { RedisServer } from '../../../../test/harness/backend.js';
import { backend, uniquePrefix } from '../../../../test/harness/fixtures.js';
import { startAgentProcess } from '../../../../test/helpers/agent-process.js';
import { tcpProxy } from '../../../../test/helpers/tcp-proxy.js';

const BURST = 2000;
/** The example service's policies (examples/reports-service/policies.json): each request checks both. */
const POLICIES = {
  reports: { capacity: 5, refillPerSecond: 0.1, onStoreFailure: 'closed' },
  'export-pages': { capacity: 100, refillPerSecond: 1, maxCost: 50, onStoreFailure: 'local' },
};
const NO_FAILURES = {
  timeout: 0,
  connection: 0,
  overloaded: 0,
  bad_status: 0,
  bad_body: 0,
  breaker_open: 0,
  refused: 0,
};

const run = promisify(execFile);

let redis: RedisServer;

beforeAll(async () => {
  // A Redis of this file's own: no script of the agent's is cached in it yet.
  redis = await backend().startRedis();
}, 30_000);

afterAll(async () => {
  await redis?.[Symbol.asyncDispose]();
});

/**
 * `n` concurrent `POST /reports` from a process of their own (as a load generator sends them), request `i` for
 * tenant `<prefix>-<i>`; the tally of status and problem code.
 */
async function burstOfNewTenants(url: string, prefix: string, n: number): Promise<Record<string, number>> {
  const script = `
    const answers = await Promise.all(Array.from({ length: ${n} }, async (_, i) => {
      const res = await fetch(${JSON.stringify(`${url}/reports`)}, {
        method: 'POST',
        headers: { 'x-tenant-id': ${JSON.stringify(prefix)} + '-' + i, 'content-type': 'application/json' },
        body: '{"pages":1}',
      });
      const body = await res.json();
      return res.status + (body.code === undefined ? '' : ' ' + body.code);
    }));
    const tally = {};
    for (const a of answers) tally[a] = (tally[a] ?? 0) + 1;
    process.stdout.write(JSON.stringify(tally));`;
  const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], {
    maxBuffer: 16 * 1024 * 1024,
  });
  return JSON.parse(stdout) as Record<string, number>;
}

describe('the first burst a freshly started agent sees', () => {
  it(
    `answers ${BURST} concurrent requests of ${BURST} new tenants as the agent decided, each admitted`,
    { timeout: 90_000 },
    async () => {
      // The agent process as it starts: its readiness is the only request before the burst.
      await using agent = await startAgentProcess({ redisUrl: redis.url, policies: POLICIES });
      const client = new AgentClient({ baseUrl: agent.url });
      const app = Fastify();
      await app.register(quotaplane, {
        client,
        subject: (r) =>
          typeof r.headers['x-tenant-id'] === 'string' ? `tenant:${r.headers['x-tenant-id']}` : undefined,
      });
      app.post(
        '/reports',
        {
          config: {
            quota: [
              { policy: 'reports' },
              { policy: 'export-pages', cost: (r) => (r.body as { pages?: number }).pages ?? 1 },
            ],
          },
        },
        (_request, reply) => reply.code(201).send({ done: true }),
      );
      const url = await app.listen({ host: '127.0.0.1', port: 0, backlog: 4096 });
      try {
        const tally = await burstOfNewTenants(url, uniquePrefix('cold'), BURST);
        const stats = client.stats();
        const metrics = await (await fetch(`${agent.url}/metrics`)).text();
        // Requests whose Redis call at the agent got no reply within the store timeout on the wire: their
        // policies fail closed as declared (503 LIMITER_UNAVAILABLE). None on an idle machine; on a loaded one
        // a starved redis-server may answer a 64-decision call late, and only then.
        const late = Number(
          /^quotaplane_store_latency_seconds_count\{operation="decide",outcome="timeout"\} (\d+)$/m.exec(
            metrics,
          )?.[1] ?? 0,
        );
        const unavailable = tally['503 LIMITER_UNAVAILABLE'] ?? 0;
        const seen = `${JSON.stringify(tally)} late on the wire at the agent: ${late}, load ${loadavg()[0]!.toFixed(1)}`;
        if (loadavg()[0]! <= availableParallelism()) expect(unavailable, seen).toBe(0);
        else if (unavailable > 0) console.warn(`client cold start: ${seen}`);
        expect(unavailable, seen).toBe(late);
        // Each tenant's first request fits both of its buckets: every other one is admitted, by the agent.
        expect(tally, JSON.stringify(stats)).toEqual({
          201: BURST - unavailable,
          ...(unavailable > 0 ? { '503 LIMITER_UNAVAILABLE': unavailable } : {}),
        });
        expect(stats.failures).toEqual(NO_FAILURES);
        expect(stats.shed).toBe(0);
        expect(stats.degraded).toEqual({ fail_open: 0, fail_closed: 0, fallback: 0 });
        const grants = client.grantStats();
        expect(stats.decided + (grants?.local ?? 0) + (grants?.denied ?? 0)).toBe(BURST);
        // The agent admitted exactly as many: each policy charged once per admitted request.
        for (const policy of Object.keys(POLICIES)) {
          const line = new RegExp(
            `^quotaplane_decisions_total\\{policy="${policy}",region="us",decision="allowed",mode="regional"\\} (\\d+)$`,
            'm',
          ).exec(metrics);
          expect(Number(line?.[1]), policy).toBe(BURST - unavailable);
        }
        // A handful of connections, opened during the burst and kept.
        expect(stats.connections).toBeGreaterThanOrEqual(1);
        expect(stats.connections).toBeLessThanOrEqual(5);
      } finally {
        await app.close();
        client.close();
      }
    },
  );
});

/** Hold this process's event loop for `ms` (a service busy with a burst). */
function stall(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until);
}

describe('the timeout runs from the write', () => {
  it('time this process takes to get to a new connection is not the agent’s', async () => {
    await using agent = await startAgentProcess({
      redisUrl: redis.url,
      policies: { wide: { capacity: 1000, refillPerSecond: 1 } },
    });
    // 150 ms each way: the answer comes 300 ms after the write, plus the agent's own time.
    const target = new URL(agent.url);
    await using proxy = await tcpProxy(
      { host: target.hostname, port: Number(target.port) },
      { delayMs: 150 },
    );
    const client = new AgentClient({ baseUrl: `http://127.0.0.1:${proxy.port}`, timeoutMs: 600 });
    try {
      const decision = client.check('wide', uniquePrefix('stalled'));
      // The client's flush (queued first) opens the connection; then this process is busy for 550 ms before it
      // takes the connection's completion and writes. Timed from the socket, the answer (≥ 850 ms) would be late.
      setImmediate(() => stall(550));
      const started = performance.now();
      const answer = await decision;
      expect(answer.degraded, JSON.stringify(client.stats())).toBeUndefined();
      expect(answer.allowed).toBe(true);
      expect(performance.now() - started).toBeGreaterThanOrEqual(850);
      expect(client.stats()).toMatchObject({ failures: NO_FAILURES, connections: 1 });
    } finally {
      client.close();
    }
  });

  it('a connection the agent never makes fails within about the timeout, as a connection failure', async () => {
    // A listener that never accepts, frozen, its accept queue (backlog 1) filled: the next SYN goes unanswered.
    const listener = spawn(
      process.execPath,
      [
        '-e',
        `const s = require('node:net').createServer();
         s.listen({ host: '127.0.0.1', port: 0, backlog: 1 }, () => {
           process.stdout.write(String(s.address().port) + '\\n');
           process.kill(process.pid, 'SIGSTOP');
         });`,
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    const held: Socket[] = [];
    try {
      const port = await new Promise<number>((resolve) =>
        listener.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))),
      );
      // Fill the accept queue: connections that the kernel completes (their connect resolves) until it is full.
      for (let i = 0; i < 8; i++) {
        const socket = connect(port, '127.0.0.1');
        socket.on('error', () => undefined);
        held.push(socket);
        const made = await Promise.race([
          new Promise<boolean>((resolve) => socket.once('connect', () => resolve(true))),
          new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 300)),
        ]);
        if (!made) break;
      }
      const client = new AgentClient({ baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 300, breaker: false });
      try {
        const started = performance.now();
        const decision = await client.check('wide', uniquePrefix('unmade'));
        const ms = performance.now() - started;
        expect(decision).toMatchObject({ allowed: false, degraded: 'fail_closed', failure: 'connection' });
        expect(ms).toBeGreaterThanOrEqual(295);
        expect(ms).toBeLessThan(1000);
        expect(client.stats().failures).toMatchObject({ connection: 1, timeout: 0 });
      } finally {
        client.close();
      }
    } finally {
      for (const s of held) s.destroy();
      listener.kill('SIGKILL');
    }
  });
});
