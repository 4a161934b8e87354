/**
 * The protected request, end to end, as a service owner measures it: the same Fastify service with one
 * protected route (`GET /work`, the tenant in `x-tenant-id`), protected by `@quotaplane/client`'s Fastify plugin
 * with its defaults (`new AgentClient({ baseUrl })`, `config: { quota: { policy } }`) against a real agent
 * process and Redis, by rate-limiter-flexible on Redis, by `@fastify/rate-limit` on Redis, and unprotected.
 * One policy: 100 per minute per tenant (a bucket of 100; rate-limiter-flexible and @fastify/rate-limit as 100 per
 * 60 s window). Tenants uniform or Zipf-distributed (s = 1.1) over 10,000.
 *
 * The services, the agent and Redis share core 1 (taskset); autocannon (64 connections) runs in this process on
 * core 0. Contenders alternate round by round. Per run: requests/s, p99, answers by status (200, 429, anything
 * else: a 503 is the limiter failing the service), and CPU per request of everything on core 1 the contender
 * uses (service + agent + Redis, from /proc/<pid>/stat, over the same saturated run).
 *
 * `direct` is the same client with `direct: { redis }` on the agent's Redis: single checks decided in the
 * service's process under the agent's terms (docs/agent.md, "Direct decisions"). Each contender has tenants of
 * its own, so no contender finds buckets another drained.
 *
 * Run as a script (`--serve quotaplane|nogrants|direct|inprocess|rlf|frl|none --port P --redis URL [--agent URL]`) it is one of the services.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import { processBackend } from '../test/harness/process-backend.js';
import { freePort, waitForPort } from '../test/harness/ports.js';
import {
  AGENT_MAIN,
  defaultAgentEnv,
  canPin,
  cpuMs,
  pinPid,
  redisPid,
  spawnServer,
  stopServer,
} from './http.bench.js';
import { alternate, median, type BenchSuite, type Comparison } from './lib.js';
import type { GrantOptions } from '../packages/client/src/grants.js';
import type { DirectOptions } from '../packages/client/src/direct.js';

const THIS_FILE = fileURLToPath(import.meta.url);
const TENANTS = 10_000;
const CONNECTIONS = 64;
const POLICY = 'service';
const CAPACITY = 100;
const WINDOW_SECONDS = 60;

type Contender = 'quotaplane' | 'nogrants' | 'direct' | 'inprocess' | 'rlf' | 'frl' | 'none';
const LABELS: Record<Contender, string> = {
  quotaplane: '@quotaplane/client (defaults)',
  nogrants: '@quotaplane/client, grants off',
  direct: '@quotaplane/client, direct decisions (direct: { redis })',
  inprocess: "the agent's bucket script in the service's process (a ceiling, not a product)",
  rlf: 'rate-limiter-flexible',
  frl: '@fastify/rate-limit',
  none: 'unprotected',
};

/** The tenant a bench request names (`x-tenant-id`), the subject every contender limits. */
export function tenantOf(request: { headers: Record<string, unknown> }): string | undefined {
  const t = request.headers['x-tenant-id'];
  return typeof t === 'string' ? t : undefined;
}

/** A seeded PRNG (mulberry32), so every contender sees the same tenant sequence. */
function random(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** 2^16 tenant names drawn uniformly or Zipf(s) over `n` (rank 1 the hottest), cycled by the load. */
export function tenantSequence(kind: 'uniform' | 'zipf', n = TENANTS, s = 1.1, length = 65_536): string[] {
  const next = random(kind === 'uniform' ? 1 : 2);
  if (kind === 'uniform') return Array.from({ length }, () => `t${Math.floor(next() * n)}`);
  const cdf = new Float64Array(n);
  let sum = 0;
  for (let k = 1; k <= n; k++) cdf[k - 1] = sum += 1 / k ** s;
  return Array.from({ length }, () => {
    const u = next() * sum;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid]! < u) lo = mid + 1;
      else hi = mid;
    }
    return `t${lo}`;
  });
}

interface Run {
  rps: number;
  total: number;
  p99: number;
  ok: number;
  limited: number;
  /** Answers neither 2xx nor 429 (503 LIMITER_UNAVAILABLE…), and socket errors and timeouts. */
  other: number;
  statuses: Record<string, number>;
  /** CPU µs per request on core 1: service + agent + Redis. */
  cpuUs: number | undefined;
}

async function load(url: string, seconds: number, tenants: string[], prefix: string): Promise<Run> {
  let i = 0;
  const result = await autocannon({
    url,
    connections: CONNECTIONS,
    duration: seconds,
    requests: [
      {
        method: 'GET',
        path: '/work',
        setupRequest: (req) => ({
          ...req,
          headers: { 'x-tenant-id': `${prefix}${tenants[i++ % tenants.length]!}` },
        }),
      },
    ],
  });
  const statuses: Record<string, number> = {};
  for (const [code, { count }] of Object.entries(result.statusCodeStats ?? {})) statuses[code] = count ?? 0;
  const limited = statuses['429'] ?? 0;
  const ok = result['2xx'];
  return {
    rps: result.requests.average,
    total: result.requests.total,
    p99: result.latency.p99,
    ok,
    limited,
    // Answers by status, not `requests.total - 2xx - 429`: requests still in flight when the run stops (one per
    // connection at most) are no answer, and counting them as "other" read as 64 failures that never happened.
    other:
      Object.entries(statuses)
        .filter(([code]) => !code.startsWith('2') && code !== '429')
        .reduce((n, [, count]) => n + count, 0) +
      result.errors +
      result.timeouts,
    statuses,
    cpuUs: undefined,
  };
}

export const serviceSuite: BenchSuite = {
  name: 'service',
  async run({ seconds, rounds }, progress) {
    await using redis = await processBackend.startRedis();
    const pin = canPin();
    const rPid = redisPid(redis.host, redis.port);
    if (pin) {
      pinPid(rPid, '1');
      pinPid(process.pid, '0');
      progress('service: the services, the agent and Redis on core 1, autocannon on core 0');
    } else progress('service: WARNING: taskset or a second core missing, nothing pinned');
    const dir = mkdtempSync(join(tmpdir(), 'qp-bench-service-'));
    const policiesFile = join(dir, 'policies.json');
    writeFileSync(
      policiesFile,
      JSON.stringify({
        policies: { [POLICY]: { capacity: CAPACITY, refillPerSecond: CAPACITY / WINDOW_SECONDS } },
      }),
    );
    // QP_BENCH_CEILING=1 adds `inprocess`: the service runs the agent's store (lua/token_bucket.lua through
    // RedisBucketStore, coalesced per turn, a full share) itself, with no agent and none of the agent's work
    // (policies, shares, failure modes, reports). No product decides that way; it measures what deciding in the
    // service's process could cost at best with this bucket, the figure a design without the agent's hop would
    // start from (docs/agent.md, "The protected request's floor").
    const ceiling = process.env['QP_BENCH_CEILING'] === '1';
    // QP_BENCH_CONTENDERS=direct,rlf,none: only these (a quicker look at a few; the README's figures run all).
    const only = process.env['QP_BENCH_CONTENDERS']?.split(',').filter((c) => c !== '');
    const names = (
      [
        'quotaplane',
        'nogrants',
        'direct',
        ...(ceiling ? (['inprocess'] as const) : []),
        'rlf',
        'frl',
        'none',
      ] as Contender[]
    ).filter((n) => only === undefined || only.length === 0 || only.includes(n));
    const [agentPort, ...ports] = await Promise.all([freePort(), ...names.map(() => freePort())]);
    const port = Object.fromEntries(names.map((n, k) => [n, ports[k]!])) as Record<Contender, number>;
    const agentUrl = `http://127.0.0.1:${agentPort}`;
    // Terms on (off by default) for the `direct` contender; the other clients never ask for one.
    const agent = spawnServer(
      [AGENT_MAIN],
      { ...defaultAgentEnv(redis.url, policiesFile, agentPort), QP_TERMS: 'on' },
      pin,
    );
    const services = Object.fromEntries(
      names.map((n) => [
        n,
        spawnServer(
          [THIS_FILE, '--serve', n, '--port', String(port[n]), '--redis', redis.url, '--agent', agentUrl],
          {},
          pin,
        ),
      ]),
    ) as Record<Contender, ReturnType<typeof spawnServer>>;
    try {
      await Promise.all([agentPort, ...ports].map((p) => waitForPort('127.0.0.1', p, 120_000)));
      const url = (n: Contender) => `http://127.0.0.1:${port[n]}`;
      const pids = (n: Contender) =>
        n === 'quotaplane' || n === 'nogrants' || n === 'direct'
          ? [services[n].pid!, agent.pid!, rPid]
          : [services[n].pid!, rPid];
      const out: Comparison[] = [];
      let warmed = false;
      const roundWarm = Number(process.env['QP_BENCH_ROUND_WARM_S'] ?? (seconds >= 3 ? 2 : 1));
      for (const distribution of ['uniform', 'zipf'] as const) {
        const tenants = tenantSequence(distribution);
        // Each distribution on its own tenants' keys: the uniform runs leave no empty buckets for Zipf.
        const prefix = `${distribution}-`;
        if (!warmed) {
          progress('service: warming up');
          for (const n of names) await load(url(n), Math.min(seconds, 2), tenants, 'warm-');
          warmed = true;
        }
        const runs = Object.fromEntries(names.map((n) => [n, [] as Run[]])) as Record<Contender, Run[]>;
        const measure = (n: Contender) => async () => {
          // Tenants of its own per contender: the three clients of the agent decide on the agent's keys, and one
          // contender's rounds must not drain the buckets another's then finds empty (cheap 429s).
          // Each round starts with the same load, unmeasured (QP_BENCH_ROUND_WARM_S, default 2 s; half with
          // --quick): a contender comes back to its tenants after the others' rounds, 20 s or more later, and is
          // measured in its steady state, as a service under load runs, not in its first seconds after a pause.
          if (roundWarm > 0) await load(url(n), roundWarm, tenants, `${prefix}${n}-`);
          const before = pids(n).map(cpuMs);
          const r = await load(url(n), seconds, tenants, `${prefix}${n}-`);
          const after = pids(n).map(cpuMs);
          // Per process (service, [agent,] Redis), µs per request.
          const split = after.map((a, k) =>
            a === undefined || before[k] === undefined || r.total === 0
              ? undefined
              : ((a - before[k]) * 1000) / r.total,
          );
          if (!split.includes(undefined)) r.cpuUs = split.reduce((a, b) => a! + b!, 0);
          runs[n].push(r);
          progress(
            `    ${distribution} ${n}: p99 ${r.p99} ms, ${r.ok} × 2xx, ${r.limited} × 429, ${r.other} other` +
              (r.other > 0 ? ` (statuses ${JSON.stringify(r.statuses)})` : '') +
              (r.cpuUs === undefined
                ? ''
                : `, ${r.cpuUs.toFixed(1)} µs CPU per request (${split.map((v) => v!.toFixed(0)).join(' + ')})`),
          );
          return r.rps;
        };
        progress(`service: ${distribution} tenants`);
        await alternate(
          Object.fromEntries(names.map((n) => [LABELS[n], measure(n)])) as Record<
            string,
            () => Promise<number>
          >,
          rounds,
          progress,
        );
        const rps = (n: Contender) => median(runs[n].map((r) => r.rps));
        const p99 = (n: Contender) => median(runs[n].map((r) => r.p99));
        const cpuUs = (n: Contender) => {
          const v = runs[n].flatMap((r) => (r.cpuUs === undefined ? [] : [r.cpuUs]));
          return v.length === 0 ? undefined : Number(median(v).toFixed(1));
        };
        if (only !== undefined && only.length > 0) {
          // A few contenders: each one's medians, no ratios against contenders that did not run.
          for (const n of names)
            out.push({
              bench: `service ${distribution}: ${LABELS[n]} requests/s (p99 ${p99(n)} ms, CPU ${cpuUs(n)} µs per request)`,
              ours: Math.round(rps(n)),
              peer: '-',
              peerValue: 0,
              ratio: 0,
            });
          continue;
        }
        const sum = (n: Contender, f: (r: Run) => number) => runs[n].reduce((a, r) => a + f(r), 0);
        const best: Contender = rps('rlf') >= rps('frl') ? 'rlf' : 'frl';
        const ratio = (a: number, b: number) => Number((a / b).toFixed(2));
        const answers = Object.fromEntries(
          names.map((n) => [
            n,
            {
              '2xx': sum(n, (r) => r.ok),
              '429': sum(n, (r) => r.limited),
              other: sum(n, (r) => r.other),
              statuses: runs[n].reduce<Record<string, number>>((acc, r) => {
                for (const [k, v] of Object.entries(r.statuses)) acc[k] = (acc[k] ?? 0) + v;
                return acc;
              }, {}),
            },
          ]),
        );
        const what = `service ${distribution} (${TENANTS.toLocaleString('en-US')} tenants, ${CAPACITY}/min each, ${CONNECTIONS} connections)`;
        out.push(
          {
            bench: `${what} requests/s (goal ≥ 1.3)`,
            ours: Math.round(rps('quotaplane')),
            peer: LABELS[best],
            peerValue: Math.round(rps(best)),
            ratio: ratio(rps('quotaplane'), rps(best)),
            details: {
              pinned: pin,
              requestsPerSecond: Object.fromEntries(names.map((n) => [n, Math.round(rps(n))])),
              oursRuns: runs.quotaplane.map((r) => Math.round(r.rps)),
              answers,
            },
          },
          {
            bench: `${what} requests/s, grants on vs off (the same client)`,
            ours: Math.round(rps('quotaplane')),
            peer: LABELS.nogrants,
            peerValue: Math.round(rps('nogrants')),
            ratio: ratio(rps('quotaplane'), rps('nogrants')),
          },
          {
            bench: `${what} requests/s vs unprotected (goal ≥ 0.85)`,
            ours: Math.round(rps('quotaplane')),
            peer: LABELS.none,
            peerValue: Math.round(rps('none')),
            ratio: ratio(rps('quotaplane'), rps('none')),
          },
          {
            bench: `${what} p99 ms (ratio = peer / ours, goal ≥ 1)`,
            ours: p99('quotaplane'),
            peer: LABELS[best],
            peerValue: p99(best),
            ratio: ratio(p99(best), Math.max(p99('quotaplane'), 1e-9)),
            details: { p99Ms: Object.fromEntries(names.map((n) => [n, p99(n)])) },
          },
        );
        const ours = cpuUs('quotaplane');
        const cheaper: Contender = (cpuUs('rlf') ?? Infinity) <= (cpuUs('frl') ?? Infinity) ? 'rlf' : 'frl';
        const peerCpu = cpuUs(cheaper);
        if (ours !== undefined && peerCpu !== undefined) {
          out.push({
            bench: `${what} CPU µs per request, service + agent + Redis (ratio = ours / peer, goal ≤ 0.75)`,
            ours,
            peer: LABELS[cheaper],
            peerValue: peerCpu,
            ratio: ratio(ours, peerCpu),
            details: { cpuUsPerRequest: Object.fromEntries(names.map((n) => [n, cpuUs(n)])) },
          });
        }
        const directCpu = cpuUs('direct');
        out.push(
          {
            bench: `${what} requests/s, ${LABELS.direct} (goal ≥ 1.3)`,
            ours: Math.round(rps('direct')),
            peer: LABELS[best],
            peerValue: Math.round(rps(best)),
            ratio: ratio(rps('direct'), rps(best)),
            details: { directRuns: runs.direct.map((r) => Math.round(r.rps)) },
          },
          {
            bench: `${what} requests/s vs unprotected, ${LABELS.direct} (goal ≥ 0.85)`,
            ours: Math.round(rps('direct')),
            peer: LABELS.none,
            peerValue: Math.round(rps('none')),
            ratio: ratio(rps('direct'), rps('none')),
          },
          {
            bench: `${what} p99 ms, ${LABELS.direct} (ratio = peer / it, goal ≥ 1)`,
            ours: p99('direct'),
            peer: LABELS[best],
            peerValue: p99(best),
            ratio: ratio(p99(best), Math.max(p99('direct'), 1e-9)),
          },
        );
        if (directCpu !== undefined && peerCpu !== undefined) {
          out.push({
            bench: `${what} CPU µs per request, service + agent + Redis, ${LABELS.direct} (ratio = it / peer, goal ≤ 0.75)`,
            ours: directCpu,
            peer: LABELS[cheaper],
            peerValue: peerCpu,
            ratio: ratio(directCpu, peerCpu),
          });
        }
        const ceilingCpu = ceiling ? cpuUs('inprocess') : undefined;
        if (ceiling && ceilingCpu !== undefined && peerCpu !== undefined) {
          out.push(
            {
              bench: `${what} requests/s, ${LABELS.inprocess}`,
              ours: Math.round(rps('inprocess')),
              peer: LABELS[best],
              peerValue: Math.round(rps(best)),
              ratio: ratio(rps('inprocess'), rps(best)),
            },
            {
              bench: `${what} CPU µs per request, ${LABELS.inprocess} (ratio = it / peer)`,
              ours: ceilingCpu,
              peer: LABELS[cheaper],
              peerValue: peerCpu,
              ratio: ratio(ceilingCpu, peerCpu),
            },
          );
        }
      }
      for (const n of ['quotaplane', 'nogrants', 'direct'] as const) {
        try {
          const stats: unknown = await (await fetch(`${url(n)}/_stats`)).json();
          progress(`service: ${LABELS[n]}: client counts ${JSON.stringify(stats)}`);
        } catch {
          // The counts are a courtesy; the figures above stand without them.
        }
      }
      return out;
    } finally {
      if (pin) pinPid(process.pid, '0-1');
      await Promise.all([...names.map((n) => stopServer(services[n])), stopServer(agent)]);
      rmSync(dir, { recursive: true, force: true });
    }
  },
};

/** One service: the same Fastify route, protected by `kind`. */
async function serve(kind: Contender, port: number, redisUrl: string, agentUrl: string): Promise<void> {
  const { default: Fastify } = await import('fastify');
  const app = Fastify();
  const work = () => ({ ok: true });
  // The event loop's delay since the service started, ms (bench/profile-service.ts prints it): a long turn (a walk
  // of many subjects, a large batch of answers) shows in its tail before it shows in the requests' p99.
  const loop = monitorEventLoopDelay({ resolution: 1 });
  loop.enable();
  app.get('/_loop', () => ({
    mean: Math.round(loop.mean / 1e4) / 100,
    p99: Math.round(loop.percentile(99) / 1e4) / 100,
    p999: Math.round(loop.percentile(99.9) / 1e4) / 100,
    max: Math.round(loop.max / 1e4) / 100,
  }));
  const closers: (() => void)[] = [];
  if (kind === 'quotaplane' || kind === 'nogrants' || kind === 'direct') {
    // As docs/agent.md shows it, with the client's defaults.
    const { AgentClient } = await import('../packages/client/src/index.js');
    const { quotaplane } = await import('../packages/client/src/fastify.js');
    // QP_BENCH_CLIENT_TIMEOUT_MS (not a default: a look at the client when its timeout is not what fails it).
    const timeout = Number(process.env['QP_BENCH_CLIENT_TIMEOUT_MS'] ?? '') || undefined;
    // QP_BENCH_MAX_EXCHANGES, QP_BENCH_MAX_BATCH: the same look at the coalescing's sizes.
    const exchanges = Number(process.env['QP_BENCH_MAX_EXCHANGES'] ?? '') || undefined;
    const maxBatch = Number(process.env['QP_BENCH_MAX_BATCH'] ?? '') || undefined;
    // QP_BENCH_SLOW_MS: when a further exchange may start beside one in flight (0: at once).
    const slow = process.env['QP_BENCH_SLOW_MS'];
    // QP_BENCH_HOT_PER_SECOND: the grant pool's hotPerSecond (a look at grants for hot subjects only).
    const hot = Number(process.env['QP_BENCH_HOT_PER_SECOND'] ?? '') || undefined;
    // QP_BENCH_GRANTS: the grant pool's options as JSON (a look at other sizings; over QP_BENCH_HOT_PER_SECOND).
    const grantsJson = process.env['QP_BENCH_GRANTS'];
    const grantOptions: GrantOptions = {
      ...(hot === undefined ? {} : { hotPerSecond: hot }),
      ...(grantsJson === undefined || grantsJson === '' ? {} : (JSON.parse(grantsJson) as GrantOptions)),
    };
    const coalesce = {
      ...(maxBatch === undefined ? {} : { maxBatch }),
      ...(slow === undefined || slow === '' ? {} : { slowMs: Number(slow) }),
    };
    // `direct`: the defaults plus a Redis client on the agent's Redis (docs/agent.md, "Direct decisions").
    let direct: DirectOptions | undefined;
    if (kind === 'direct') {
      const { Redis } = await import('ioredis');
      const redis = new Redis(redisUrl);
      closers.push(() => redis.disconnect());
      // QP_BENCH_DIRECT_GRANTS: direct decisions' `grants` as JSON (`false`: none taken ahead), a look at other sizings.
      const grants = process.env['QP_BENCH_DIRECT_GRANTS'];
      direct = {
        redis,
        ...(grants === undefined || grants === ''
          ? {}
          : { grants: JSON.parse(grants) as NonNullable<DirectOptions['grants']> }),
      };
    }
    const client = new AgentClient({
      baseUrl: agentUrl,
      ...(direct === undefined ? {} : { direct }),
      ...(timeout === undefined ? {} : { timeoutMs: timeout }),
      ...(exchanges === undefined ? {} : { maxExchanges: exchanges }),
      ...(Object.keys(coalesce).length === 0 ? {} : { coalesce }),
      ...(kind !== 'nogrants'
        ? Object.keys(grantOptions).length === 0
          ? {}
          : { grants: grantOptions }
        : { grants: false }),
    });
    closers.push(() => client.close());
    await app.register(quotaplane, { client, subject: tenantOf });
    app.get('/work', { config: { quota: { policy: POLICY } } }, work);
    app.get('/_stats', () => ({
      ...client.stats(),
      grants: client.grantStats(),
      direct: client.directStats(),
    }));
  } else if (kind === 'inprocess') {
    const { Redis } = await import('ioredis');
    const { RedisBucketStore } = await import('../regional-agent/redis/bucket-store.js');
    const redis = new Redis(redisUrl);
    closers.push(() => redis.disconnect());
    const store = new RedisBucketStore(redis);
    const ttlMs = Math.ceil((CAPACITY / (CAPACITY / WINDOW_SECONDS)) * 1000);
    app.get(
      '/work',
      {
        preHandler: async (request, reply) => {
          const key = tenantOf(request);
          if (key === undefined) return reply.code(400).send({ error: 'no tenant' });
          const d = await store.decide({
            checks: [
              {
                // Its own keys: the agent keeps `rl:v1:{tenant}:service` on the same Redis for the client contenders.
                key: `rl:v1:{ceiling-${key}}:${POLICY}`,
                capacity: CAPACITY,
                refillPerSecond: CAPACITY / WINDOW_SECONDS,
                cost: 1,
                ttlMs,
              },
            ],
          });
          reply.header('x-ratelimit-remaining', Math.floor(d.results[0]!.remaining));
          if (!d.allowed) {
            return reply
              .code(429)
              .header('retry-after', Math.ceil((d.retryAfterMs ?? 0) / 1000))
              .send({ error: 'Too Many Requests' });
          }
        },
      },
      work,
    );
  } else if (kind === 'rlf') {
    const { Redis } = await import('ioredis');
    const { RateLimiterRedis, RateLimiterRes } = await import('rate-limiter-flexible');
    const redis = new Redis(redisUrl);
    closers.push(() => redis.disconnect());
    const limiter = new RateLimiterRedis({
      storeClient: redis,
      keyPrefix: 'rlf',
      points: CAPACITY,
      duration: WINDOW_SECONDS,
    });
    app.get(
      '/work',
      {
        preHandler: async (request, reply) => {
          const key = tenantOf(request);
          if (key === undefined) return reply.code(400).send({ error: 'no tenant' });
          try {
            const r = await limiter.consume(key);
            reply.header('x-ratelimit-remaining', r.remainingPoints);
          } catch (error) {
            if (!(error instanceof RateLimiterRes)) throw error;
            return reply
              .code(429)
              .header('retry-after', Math.ceil(error.msBeforeNext / 1000))
              .send({ error: 'Too Many Requests' });
          }
        },
      },
      work,
    );
  } else if (kind === 'frl') {
    const { Redis } = await import('ioredis');
    const { default: rateLimit } = await import('@fastify/rate-limit');
    const redis = new Redis(redisUrl);
    closers.push(() => redis.disconnect());
    await app.register(rateLimit, { global: false, redis, nameSpace: 'frl-' });
    app.get(
      '/work',
      {
        config: {
          rateLimit: {
            max: CAPACITY,
            timeWindow: WINDOW_SECONDS * 1000,
            keyGenerator: (request) => tenantOf(request) ?? 'anonymous',
          },
        },
      },
      work,
    );
  } else {
    app.get('/work', work);
  }
  await app.listen({ host: '127.0.0.1', port });
  process.on('SIGTERM', () => {
    void app.close().then(() => {
      for (const close of closers) close();
      process.exit(0);
    });
  });
}

if (process.argv[1] === THIS_FILE) {
  const { values } = parseArgs({
    options: {
      serve: { type: 'string' },
      port: { type: 'string' },
      redis: { type: 'string' },
      agent: { type: 'string' },
    },
  });
  const kind = values.serve as Contender | undefined;
  if (
    kind === undefined ||
    !['quotaplane', 'nogrants', 'direct', 'inprocess', 'rlf', 'frl', 'none'].includes(kind) ||
    values.port === undefined ||
    values.redis === undefined ||
    values.agent === undefined
  ) {
    console.error(
      'usage: node --import tsx bench/service.bench.ts --serve quotaplane|nogrants|direct|inprocess|rlf|frl|none --port P --redis URL --agent URL',
    );
    process.exit(2);
  }
  await serve(kind, Number(values.port), values.redis, values.agent);
}
