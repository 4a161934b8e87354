/**
 * The HTTP decision service under load: autocannon on loopback against `POST /v1/decisions` of the real agent
 * process (regional-agent/main.ts), beside the same job done by a Fastify route with rate-limiter-flexible
 * (`RateLimiterRedis.consume`) and by `@fastify/rate-limit` with its Redis store. Every server is its own
 * process on the same fresh Redis; contenders alternate round by round; the load generator, the servers and
 * Redis share the machine's cores. Also a layered request (three checks per request) against
 * rate-limiter-flexible consuming three limiters per request. Two references run beside them and are no peers: the
 * same Fastify route answering with no limiter at all (the HTTP floor), and the agent's whole decision path on its
 * in-memory model store (what its contract costs above that floor before any Redis call).
 *
 * On a 2-core machine the load generator would otherwise take CPU from whichever server it loads; when `taskset`
 * is available, Redis and the server under test share core 1 and the load generator (this process) has core 0,
 * so the figure measures what a server and its Redis can do on one core. The same for every contender.
 *
 * Run as a script (`--serve rlf|fastify-rate-limit|no-limiter --port P --redis URL`, or `--serve agent-in-memory
 * --port P`) it is one of those servers.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import { processBackend } from '../test/harness/process-backend.js';
import { freePort, waitForPort } from '../test/harness/ports.js';
import { alternate, median, type BenchSuite, type Comparison } from './lib.js';

const SUBJECTS = 10_000;
const CONNECTIONS = 64;
const THIS_FILE = fileURLToPath(import.meta.url);

/** 120 per minute, burst 120: mostly admitted, as in the store bench. */
const POLICIES = {
  writes: { capacity: 120, refillPerSecond: 2, maxCost: 1 },
  tenant: { capacity: 1000, refillPerSecond: 20 },
  user: { capacity: 120, refillPerSecond: 2 },
  endpoint: { capacity: 600, refillPerSecond: 10 },
};

export interface Load {
  total: number;
  p50: number;
  p99: number;
  rps: number;
  non2xx: number;
  errors: number;
}

export async function load(
  url: string,
  seconds: number,
  body: (i: number) => string,
  rate?: number,
  path = '/v1/decisions',
  connections = CONNECTIONS,
): Promise<Load> {
  let i = 0;
  const result = await autocannon({
    url,
    connections,
    duration: seconds,
    ...(rate === undefined ? {} : { overallRate: rate }),
    requests: [
      {
        method: 'POST',
        path,
        headers: { 'content-type': 'application/json' },
        setupRequest: (req) => ({ ...req, body: body(i++) }),
      },
    ],
  });
  return {
    total: result.requests.total,
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
  };
}

/** Fixed request rate of the CPU-cost runs: below what any contender saturates at on this machine. */
const COST_RATE = 1500;

/** CPU time (user + system) a process has used, in ms; undefined where /proc is not there. */
export function cpuMs(pid: number): number | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}
const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/**
 * CPU cost of one decision: server and Redis CPU time over a run at a fixed rate, per request. Unlike
 * throughput on a shared 2-core machine, it barely moves with whatever else the machine is doing.
 */
async function cpuPerDecision(
  url: string,
  seconds: number,
  body: (i: number) => string,
  serverPid: number,
  redisProcess: number,
): Promise<{ server: number; redis: number } | undefined> {
  const before = [cpuMs(serverPid), cpuMs(redisProcess)];
  const run = await load(url, seconds, body, COST_RATE);
  const after = [cpuMs(serverPid), cpuMs(redisProcess)];
  if (before.includes(undefined) || after.includes(undefined) || run.total === 0) return undefined;
  return {
    server: ((after[0]! - before[0]!) * 1000) / run.total,
    redis: ((after[1]! - before[1]!) * 1000) / run.total,
  };
}

/** Pin processes to cores with taskset when the machine has it and at least two cores. */
export function canPin(): boolean {
  try {
    execFileSync('taskset', ['-p', String(process.pid)], { stdio: 'ignore' });
    return execFileSync('nproc', { encoding: 'utf8' }).trim() !== '1';
  } catch {
    return false;
  }
}

export function pinPid(pid: number, cores: string): void {
  execFileSync('taskset', ['-a', '-cp', cores, String(pid)], { stdio: 'ignore' });
}

export function redisPid(host: string, port: number): number {
  const info = execFileSync('redis-cli', ['-h', host, '-p', String(port), 'INFO', 'server'], {
    encoding: 'utf8',
  });
  return Number(/process_id:(\d+)/.exec(info)?.[1]);
}

/** A TypeScript server on core 1 when `pin`; `nodeFlags` go before the script (e.g. `--cpu-prof`). */
export function spawnServer(
  args: string[],
  env: Record<string, string>,
  pin: boolean,
  nodeFlags: string[] = [],
): ChildProcess {
  const command = pin ? 'taskset' : process.execPath;
  const prefix = pin ? ['-c', '1', process.execPath] : [];
  const child = spawn(command, [...prefix, ...nodeFlags, '--import', 'tsx', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  return child;
}

export async function stopServer(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

/** The agent process, as `npm start` runs each region's. */
export const AGENT_MAIN = fileURLToPath(new URL('../regional-agent/main.ts', import.meta.url));

/** The agent with its shipped defaults, standalone on `policiesFile`, listening on `port`; only its logs are quiet. */
export function defaultAgentEnv(
  redisUrl: string,
  policiesFile: string,
  port: number,
): Record<string, string> {
  return {
    QP_REGION: 'bench',
    QP_REDIS_URL: redisUrl,
    QP_POLICIES_FILE: policiesFile,
    QP_PORT: String(port),
    QP_LOG_LEVEL: 'warn',
    QP_LOG_SAMPLE_RATE: '0',
  };
}

/**
 * The agent's environment in the http benches: `defaultAgentEnv`, except that, as the peers wait for Redis however
 * long it takes, so does the agent here (a 5 s store timeout, no in-flight bound), so that every answer measured is
 * a real decision and none a fast failure-mode answer (the http suite checks).
 */
export function benchAgentEnv(
  redisUrl: string,
  policiesFile: string,
  port: number,
  batching: 'batch' | 'auto' = 'batch',
): Record<string, string> {
  return {
    ...defaultAgentEnv(redisUrl, policiesFile, port),
    QP_STORE_TIMEOUT_MS: '5000',
    QP_MAX_IN_FLIGHT: '100000',
    QP_STORE_BATCHING: batching,
  };
}

/** The policies every bench server enforces, as a policies file for the agent (in `dir`). */
export function writeBenchPolicies(dir: string): string {
  const file = join(dir, 'policies.json');
  writeFileSync(file, JSON.stringify({ policies: POLICIES }));
  return file;
}

const single = (i: number) => JSON.stringify({ policy: 'writes', subject: `tenant-${i % SUBJECTS}` });
/** Decisions per `POST /v1/decisions/batch` in the batched figure (the client's default `maxBatch`). */
const BATCH = 64;
/** Connections of the batched figure: a few service processes, each with the client's 4 exchanges in flight. */
const BATCH_CONNECTIONS = 8;
const batchOf = (i: number) =>
  `{"decisions":[${Array.from({ length: BATCH }, (_, j) => single(i * BATCH + j)).join(',')}]}`;
const layered = (i: number) => {
  const subject = `tenant-${i % SUBJECTS}`;
  return JSON.stringify({
    checks: [
      { policy: 'tenant', subject },
      { policy: 'user', subject },
      { policy: 'endpoint', subject },
    ],
  });
};

export const httpSuite: BenchSuite = {
  name: 'http',
  async run({ seconds, rounds }, progress) {
    await using redis = await processBackend.startRedis();
    const pin = canPin();
    if (pin) {
      pinPid(redisPid(redis.host, redis.port), '1');
      pinPid(process.pid, '0');
      progress('http: Redis and the server under test on core 1, the load generator on core 0');
    }
    const dir = mkdtempSync(join(tmpdir(), 'qp-bench-http-'));
    const policiesFile = writeBenchPolicies(dir);
    const [agentPort, rlfPort, frlPort, autoPort, floorPort, memoryPort] = await Promise.all([
      freePort(),
      freePort(),
      freePort(),
      freePort(),
      freePort(),
      freePort(),
    ]);
    const agentEnv = (port: number, batching: 'batch' | 'auto') =>
      benchAgentEnv(redis.url, policiesFile, port, batching);
    const agentMain = AGENT_MAIN;
    const servers = [
      // The agent as it ships: concurrent decisions batched into one script call per event-loop turn.
      spawnServer([agentMain], agentEnv(agentPort, 'batch'), pin),
      spawnServer([THIS_FILE, '--serve', 'rlf', '--port', String(rlfPort), '--redis', redis.url], {}, pin),
      spawnServer(
        [THIS_FILE, '--serve', 'fastify-rate-limit', '--port', String(frlPort), '--redis', redis.url],
        {},
        pin,
      ),
      // The same agent with ioredis auto-pipelining instead of its own batcher: one script call per decision,
      // the calls of one event-loop turn written together.
      spawnServer([agentMain], agentEnv(autoPort, 'auto'), pin),
      // Two references, not peers: the same Fastify route with no limiter (the HTTP floor every server stands
      // on), and the agent's whole decision path on its in-memory model store (what its contract costs above
      // that floor, before any Redis call).
      spawnServer(
        [THIS_FILE, '--serve', 'no-limiter', '--port', String(floorPort), '--redis', redis.url],
        {},
        pin,
      ),
      spawnServer([THIS_FILE, '--serve', 'agent-in-memory', '--port', String(memoryPort)], {}, pin),
    ];
    try {
      await Promise.all(
        [agentPort, rlfPort, frlPort, autoPort, floorPort, memoryPort].map((p) =>
          waitForPort('127.0.0.1', p, 30_000),
        ),
      );
      const url = (port: number) => `http://127.0.0.1:${port}`;
      progress('http: warming up');
      // Long enough for the JIT and for every subject's keys to exist, for each server alike.
      for (const port of [agentPort, rlfPort, frlPort, autoPort, floorPort, memoryPort])
        await load(url(port), 3, single);
      for (const port of [agentPort, rlfPort]) await load(url(port), 2, layered);
      await load(url(agentPort), 2, batchOf, undefined, '/v1/decisions/batch', BATCH_CONNECTIONS);

      const results = {
        ours: [] as Load[],
        rlf: [] as Load[],
        frl: [] as Load[],
        auto: [] as Load[],
        floor: [] as Load[],
        memory: [] as Load[],
        batch: [] as Load[],
      };
      const measure = (name: keyof typeof results, port: number, body: (i: number) => string) => async () => {
        const r = await load(url(port), seconds, body);
        results[name].push(r);
        return r.rps;
      };
      const runs = await alternate(
        {
          ours: measure('ours', agentPort, single),
          'rate-limiter-flexible': measure('rlf', rlfPort, single),
          '@fastify/rate-limit': measure('frl', frlPort, single),
          'ours, ioredis auto-pipelining': measure('auto', autoPort, single),
          'Fastify route, no limiter': measure('floor', floorPort, single),
          'ours, in-memory store': measure('memory', memoryPort, single),
          // Decisions/s through the batch route, as the client coalesces them: requests/s × BATCH.
          'ours, batched': async () => {
            const r = await load(
              url(agentPort),
              seconds,
              batchOf,
              undefined,
              '/v1/decisions/batch',
              BATCH_CONNECTIONS,
            );
            results.batch.push(r);
            return r.rps * BATCH;
          },
        },
        rounds,
        progress,
      );
      const layeredResults = { ours: [] as Load[], rlf: [] as Load[] };
      const measureLayered = (name: keyof typeof layeredResults, port: number) => async () => {
        const r = await load(url(port), seconds, layered);
        layeredResults[name].push(r);
        return r.rps;
      };
      const layeredRuns = await alternate(
        { ours: measureLayered('ours', agentPort), 'rate-limiter-flexible': measureLayered('rlf', rlfPort) },
        rounds,
        progress,
      );

      const costs: Record<string, { server: number; redis: number }[]> = {
        ours: [],
        rlf: [],
        frl: [],
        floor: [],
      };
      const rPid = redisPid(redis.host, redis.port);
      for (let r = 0; r < rounds; r++) {
        for (const [name, port, child] of [
          ['ours', agentPort, servers[0]!],
          ['rlf', rlfPort, servers[1]!],
          ['frl', frlPort, servers[2]!],
          ['floor', floorPort, servers[4]!],
        ] as const) {
          const cost = await cpuPerDecision(url(port), seconds, single, child.pid!, rPid);
          if (cost === undefined) continue;
          costs[name]!.push(cost);
          progress(
            `  cost round ${r + 1}/${rounds} ${name}: ${(cost.server + cost.redis).toFixed(1)} µs CPU per decision (server ${cost.server.toFixed(1)}, Redis ${cost.redis.toFixed(1)})`,
          );
        }
      }

      const metrics = await (await fetch(`${url(agentPort)}/metrics`)).text();
      let degraded = 0;
      for (const m of metrics.matchAll(/^quotaplane_degraded_decisions_total\{[^}]*\} (\d+)/gm))
        degraded += Number(m[1]);
      if (degraded > 0)
        progress(`http: WARNING: ${degraded} of the agent's answers were failure-mode answers`);

      const p99 = (loads: Load[]) => median(loads.map((l) => l.p99));
      const ours = median(runs.ours);
      const rlf = median(runs['rate-limiter-flexible']);
      const frl = median(runs['@fastify/rate-limit']);
      const auto = median(runs['ours, ioredis auto-pipelining']);
      const faster = rlf >= frl ? 'rate-limiter-flexible' : '@fastify/rate-limit';
      const peer = Math.max(rlf, frl);
      const peerP99 = faster === 'rate-limiter-flexible' ? p99(results.rlf) : p99(results.frl);
      const layeredOurs = median(layeredRuns.ours);
      const layeredPeer = median(layeredRuns['rate-limiter-flexible']);
      const errors = (loads: Load[]) => loads.reduce((n, l) => n + l.errors, 0);
      const costOf = (name: string) => ({
        server: median(costs[name]!.map((c) => c.server)),
        redis: median(costs[name]!.map((c) => c.redis)),
      });
      const total = (c: { server: number; redis: number }) => c.server + c.redis;
      const out: Comparison[] = [
        {
          bench: `http decisions/s (POST /v1/decisions, ${CONNECTIONS} connections, 10k subjects)`,
          ours: Math.round(ours),
          peer: faster,
          peerValue: Math.round(peer),
          ratio: Number((ours / peer).toFixed(2)),
          details: {
            pinned: pin,
            oursRuns: runs.ours.map(Math.round),
            rateLimiterFlexible: Math.round(rlf),
            fastifyRateLimit: Math.round(frl),
            p99Ms: { ours: p99(results.ours), rlf: p99(results.rlf), frl: p99(results.frl) },
            p50Ms: {
              ours: median(results.ours.map((l) => l.p50)),
              rlf: median(results.rlf.map((l) => l.p50)),
              frl: median(results.frl.map((l) => l.p50)),
            },
            errors: { ours: errors(results.ours), rlf: errors(results.rlf), frl: errors(results.frl) },
            non2xx: { ours: results.ours.reduce((n, l) => n + l.non2xx, 0) },
            degradedDecisions: degraded,
          },
        },
        {
          bench: 'http p99 latency ms (same runs; ratio = peer / ours, > 1 means ours is faster)',
          ours: p99(results.ours),
          peer: faster,
          peerValue: peerP99,
          ratio: Number((peerP99 / Math.max(p99(results.ours), 1e-9)).toFixed(2)),
        },
        {
          bench: 'http decisions/s: micro-batcher (ours) vs ioredis auto-pipelining (same agent)',
          ours: Math.round(ours),
          peer: 'QP_STORE_BATCHING=auto',
          peerValue: Math.round(auto),
          ratio: Number((ours / auto).toFixed(2)),
          details: { p99Ms: { batch: p99(results.ours), auto: p99(results.auto) } },
        },
        {
          bench: 'http layered decisions/s (3 checks per request)',
          ours: Math.round(layeredOurs),
          peer: 'rate-limiter-flexible (3 limiters per request)',
          peerValue: Math.round(layeredPeer),
          ratio: Number((layeredOurs / layeredPeer).toFixed(2)),
          details: {
            p99Ms: { ours: p99(layeredResults.ours), rlf: p99(layeredResults.rlf) },
            errors: { ours: errors(layeredResults.ours), rlf: errors(layeredResults.rlf) },
          },
        },
      ];
      const batched = median(runs['ours, batched']);
      out.push({
        bench: `http decisions/s through POST /v1/decisions/batch (${BATCH} per request, ${BATCH_CONNECTIONS} connections) vs the peers' per-request`,
        ours: Math.round(batched),
        peer: faster,
        peerValue: Math.round(peer),
        ratio: Number((batched / peer).toFixed(2)),
        details: {
          batchRuns: runs['ours, batched'].map(Math.round),
          perRequest: Math.round(ours),
          overPerRequest: Number((batched / ours).toFixed(2)),
          p99MsPerBatch: p99(results.batch),
          errors: errors(results.batch),
          non2xx: results.batch.reduce((n, l) => n + l.non2xx, 0),
        },
      });
      const floor = median(runs['Fastify route, no limiter']);
      const memory = median(runs['ours, in-memory store']);
      out.push(
        {
          bench: 'http decisions/s, reference: the same Fastify route with no limiter (ratio = ours / it)',
          ours: Math.round(ours),
          peer: 'no limiter',
          peerValue: Math.round(floor),
          ratio: Number((ours / floor).toFixed(2)),
          details: {
            rateLimiterFlexibleOverFloor: Number((rlf / floor).toFixed(2)),
            goal: Math.round(1.3 * rlf),
          },
        },
        {
          bench:
            'http decisions/s, reference: ours on its in-memory store, no Redis (vs rate-limiter-flexible on Redis)',
          ours: Math.round(memory),
          peer: 'rate-limiter-flexible',
          peerValue: Math.round(rlf),
          ratio: Number((memory / rlf).toFixed(2)),
        },
      );
      if (costs['ours']!.length > 0) {
        const cheaper = total(costOf('rlf')) <= total(costOf('frl')) ? 'rlf' : 'frl';
        out.push({
          bench: `http CPU µs per decision, server + Redis, at ${COST_RATE} req/s (ratio = peer / ours, > 1 means ours is cheaper)`,
          ours: Number(total(costOf('ours')).toFixed(1)),
          peer: cheaper === 'rlf' ? 'rate-limiter-flexible' : '@fastify/rate-limit',
          peerValue: Number(total(costOf(cheaper)).toFixed(1)),
          ratio: Number((total(costOf(cheaper)) / total(costOf('ours'))).toFixed(2)),
          details: {
            ours: costOf('ours'),
            rlf: costOf('rlf'),
            frl: costOf('frl'),
            noLimiter: costOf('floor'),
          },
        });
      }
      return out;
    } finally {
      if (pin) pinPid(process.pid, '0-1');
      await Promise.all(servers.map(stopServer));
      rmSync(dir, { recursive: true, force: true });
    }
  },
};

/** The peers: a Fastify route doing the agent's job with another limiter. */
async function serve(kind: string, port: number, redisUrl: string): Promise<void> {
  const { default: Fastify } = await import('fastify');
  const { Redis } = await import('ioredis');
  const redis = new Redis(redisUrl);
  const app = Fastify();
  type Body = {
    policy?: string;
    subject?: string;
    cost?: number;
    checks?: { policy: string; subject: string }[];
  };
  if (kind === 'rlf') {
    const { RateLimiterRedis, RateLimiterRes } = await import('rate-limiter-flexible');
    const limiters = new Map(
      Object.entries(POLICIES).map(([name, p]) => [
        name,
        new RateLimiterRedis({
          storeClient: redis,
          keyPrefix: `rlf-${name}`,
          points: p.capacity,
          duration: Math.ceil(p.capacity / p.refillPerSecond),
        }),
      ]),
    );
    const consume = async (policy: string, subject: string, cost = 1) => {
      try {
        const r = await limiters.get(policy)!.consume(subject, cost);
        return { policy, allowed: true, remaining: r.remainingPoints, retryAfterMs: 0 };
      } catch (error) {
        if (!(error instanceof RateLimiterRes)) throw error;
        return { policy, allowed: false, remaining: error.remainingPoints, retryAfterMs: error.msBeforeNext };
      }
    };
    app.post<{ Body: Body }>('/v1/decisions', async (request) => {
      const body = request.body;
      const checks = body.checks ?? [{ policy: body.policy!, subject: body.subject! }];
      const results = await Promise.all(checks.map((c) => consume(c.policy, c.subject)));
      return { allowed: results.every((r) => r.allowed), results };
    });
  } else if (kind === 'fastify-rate-limit') {
    const { default: rateLimit } = await import('@fastify/rate-limit');
    await app.register(rateLimit, {
      global: false,
      redis,
      nameSpace: 'frl-',
    });
    app.post<{ Body: Body }>(
      '/v1/decisions',
      {
        config: {
          rateLimit: {
            max: POLICIES.writes.capacity,
            timeWindow: 60_000,
            hook: 'preHandler',
            keyGenerator: (request) => (request.body as Body).subject ?? 'anonymous',
          },
        },
      },
      (request, reply) =>
        reply.send({ allowed: true, results: [{ policy: request.body.policy, allowed: true }] }),
    );
  } else if (kind === 'no-limiter') {
    // The floor every contender stands on: the same Fastify route and JSON round trip, no limiter at all.
    app.post<{ Body: Body }>('/v1/decisions', (request, reply) =>
      reply.send({
        allowed: true,
        results: [{ policy: request.body.policy, allowed: true, remaining: 119, retryAfterMs: 0 }],
      }),
    );
  } else {
    throw new Error(`unknown peer ${kind}`);
  }
  await app.listen({ host: '127.0.0.1', port });
  process.on('SIGTERM', () => {
    void app.close().then(() => {
      redis.disconnect();
      process.exit(0);
    });
  });
}

/**
 * The agent's whole HTTP decision path (regional-agent/app.ts: validation, layers, failure modes, headers,
 * metrics) on the in-memory model store instead of Redis: what the agent's contract costs above HTTP alone.
 */
async function serveAgentInMemory(port: number): Promise<void> {
  const { pino } = await import('pino');
  const { systemClock } = await import('../core/clock.js');
  const { parsePolicy } = await import('../core/policy/policy.js');
  const { StaticShareView } = await import('../core/shares/shares.js');
  const { buildApp } = await import('../regional-agent/app.js');
  const { AgentConfig } = await import('../regional-agent/config.js');
  const { ModelDecisionStore } = await import('../regional-agent/decisions/model-decision-store.js');
  const { StaticPolicySource } = await import('../regional-agent/policies/static-policy-source.js');
  const agent = buildApp(
    {
      store: new ModelDecisionStore(systemClock),
      policies: new StaticPolicySource(
        Object.entries(POLICIES).map(([name, p]) => parsePolicy({ name, ...p })),
      ),
      shares: new StaticShareView(),
      log: pino({ level: 'warn' }),
    },
    AgentConfig.parse({
      region: 'bench',
      redisUrl: 'redis://127.0.0.1:1',
      policiesFile: 'unused',
      logSampleRate: 0,
      maxInFlight: 100_000,
    }),
  );
  await agent.app.listen({ host: '127.0.0.1', port });
  process.on('SIGTERM', () => void agent.close().then(() => process.exit(0)));
}

if (process.argv[1] === THIS_FILE) {
  const { values } = parseArgs({
    options: { serve: { type: 'string' }, port: { type: 'string' }, redis: { type: 'string' } },
  });
  if (values.serve === 'agent-in-memory' && values.port !== undefined) {
    await serveAgentInMemory(Number(values.port));
  } else if (values.serve === undefined || values.port === undefined || values.redis === undefined) {
    console.error(
      'usage: node --import tsx bench/http.bench.ts --serve rlf|fastify-rate-limit|no-limiter --port P --redis URL\n' +
        '       node --import tsx bench/http.bench.ts --serve agent-in-memory --port P',
    );
    process.exit(2);
  } else {
    await serve(values.serve, Number(values.port), values.redis);
  }
}
