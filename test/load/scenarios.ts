/**
 * The seed scenarios of skewed traffic, each against the stack as `npm start` starts it (or, for latency
 * injection, one agent behind a delaying TCP proxy), loopback only, bounded in count and time. Each returns one
 * table row: what was offered and admitted, the bound admissions must stay under, false denials by reason,
 * shed answers, latency and errors.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { processBackend } from '../harness/process-backend.js';
import { freePort, waitForPort } from '../harness/ports.js';
import { burstPool, decide, metric, quantile, type Answer } from '../helpers/decision-load.js';
import type { RealStack } from '../helpers/real-stack.js';
import { PROXY_MAIN, type ProxyPorts, type ProxySpec } from '../helpers/tcp-proxy.js';
import { eventually } from '../helpers/wait.js';

const ROOT = new URL('../..', import.meta.url).pathname;

/** One row of the reliability table. */
export interface Row {
  scenario: string;
  offered: number;
  admitted: number;
  /** Admissions (tokens, for weighted costs) must stay at or under this; null where no budget binds. */
  bound: number | null;
  /** Denials the design says should not happen (normal tenants under budget, or failure reasons), by reason. */
  falseDenials: Record<string, number>;
  shed: number;
  p50: number;
  p99: number;
  errors: number;
  /** Extra facts (memory figures), printed under the table. */
  notes?: string;
  /** Why the row fails its own check; empty when it holds. */
  problems: string[];
}

export interface ScenarioContext {
  stack: RealStack;
  /** Scale: 1 for the full suite, small for the CI one. */
  short: boolean;
}

const pool = burstPool(2048);
const FAILURE_REASONS = new Set(['store_unavailable', 'home_unreachable', 'no_lease', 'fail_open']);

/**
 * Send `total` requests at `ratePerSecond` (spread evenly), at most `concurrency` in flight; `make(i)` names
 * the agent and the body. Bounded by count; returns every answer in order.
 */
async function paced(
  total: number,
  ratePerSecond: number,
  concurrency: number,
  make: (i: number) => { url: string; body: Record<string, unknown> },
): Promise<Answer[]> {
  const answers = new Array<Answer>(total);
  const started = performance.now();
  let next = 0;
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= total) return;
      const due = started + (i * 1000) / ratePerSecond;
      const wait = due - performance.now();
      if (wait > 1) await new Promise((r) => setTimeout(r, wait));
      const { url, body } = make(i);
      answers[i] = await decide(pool, url, body, 10_000);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return answers;
}

function summarize(
  scenario: string,
  answers: readonly Answer[],
  admittedOf: (a: Answer, i: number) => number,
  bound: number | null,
  falseDenial: (a: Answer, i: number) => string | undefined,
): Row {
  let admitted = 0;
  let shed = 0;
  let errors = 0;
  const falseDenials: Record<string, number> = {};
  answers.forEach((a, i) => {
    if (a.status === 503 && a.reason === 'overloaded') shed++;
    else if (a.status !== 200) errors++;
    if (a.allowed) admitted += admittedOf(a, i);
    const why = falseDenial(a, i);
    if (why !== undefined) falseDenials[why] = (falseDenials[why] ?? 0) + 1;
  });
  const ms = answers.map((a) => a.ms);
  const problems: string[] = [];
  if (bound !== null && admitted > bound) problems.push(`admitted ${admitted} > bound ${bound}`);
  if (errors > 0) problems.push(`${errors} answers neither a decision nor an explicit shed`);
  for (const [why, n] of Object.entries(falseDenials)) problems.push(`${n} false denials (${why})`);
  return {
    scenario,
    offered: answers.length,
    admitted,
    bound,
    falseDenials,
    shed,
    p50: Math.round(quantile(ms, 0.5) * 10) / 10,
    p99: Math.round(quantile(ms, 0.99) * 10) / 10,
    errors,
    problems,
  };
}

/** A denial that blames a failure (store, home, lease) rather than quota. */
const failureDenial = (a: Answer): string | undefined =>
  a.status === 200 && a.reason !== undefined && FAILURE_REASONS.has(a.reason) ? a.reason : undefined;

const agentsOf = (ctx: ScenarioContext) => Object.values(ctx.stack.agents);

/** 10× a policy's rate from 3 regions at once, on one tenant, for 30 s (3 s short). */
export async function campaign(ctx: ScenarioContext): Promise<Row> {
  const C = 100;
  const R = 10;
  const seconds = ctx.short ? 3 : 30;
  await ctx.stack.createPolicy('campaign', { capacity: C, refillPerSecond: R });
  const agents = agentsOf(ctx);
  const total = 10 * R * seconds + C;
  const started = performance.now();
  const answers = await paced(total, 10 * R + C / seconds, 64, (i) => ({
    url: agents[i % agents.length]!,
    body: { policy: 'campaign', subject: 'campaign-tenant' },
  }));
  const window = (performance.now() - started) / 1000;
  return summarize(
    `09:00 campaign: 10× rate from 3 regions, ${seconds} s`,
    answers,
    () => 1,
    Math.floor(C + R * window),
    failureDenial,
  );
}

/** One tenant sending far above its budget beside 1,000 normal ones (each well under theirs). */
export async function hotTenant(ctx: ScenarioContext): Promise<Row> {
  await ctx.stack.createPolicy('hot', { capacity: 20, refillPerSecond: 2 });
  const agents = agentsOf(ctx);
  const normal = ctx.short ? 300 : 1000;
  const hot = ctx.short ? 1500 : 6000;
  const order = Array.from({ length: hot + normal * 2 }, (_, i) => i);
  const answers = await paced(order.length, ctx.short ? 1500 : 2000, 128, (i) => {
    // Every third request is a normal tenant's (two each), the rest the hot tenant's.
    const normalIndex = i % 3 === 0 ? i / 3 : -1;
    const subject =
      normalIndex >= 0 && normalIndex < normal * 2 ? `normal-${normalIndex % normal}` : 'hot-tenant';
    // A normal tenant's traffic lives in its own region.
    const url = subject === 'hot-tenant' ? agents[i % agents.length]! : agents[normalIndex % agents.length]!;
    return { url, body: { policy: 'hot', subject } };
  });
  const isNormal = (i: number) => i % 3 === 0 && i / 3 < normal * 2;
  return summarize(
    `hot tenant beside ${normal} normal ones`,
    answers,
    (_a, i) => (isNormal(i) ? 0 : 1),
    null,
    (a, i) => {
      if (a.status === 200 && !a.allowed && isNormal(i))
        return `normal tenant denied${a.reason ? ` (${a.reason})` : ''}`;
      return failureDenial(a);
    },
  );
}

async function redisFacts(ctx: ScenarioContext): Promise<{ keys: number; memory: number }> {
  let keys = 0;
  let memory = 0;
  for (const url of Object.values(ctx.stack.state.redis)) {
    const redis = new Redis(url);
    try {
      keys += await redis.dbsize();
      memory += Number(/used_memory:(\d+)/.exec(await redis.info('memory'))?.[1] ?? 0);
    } finally {
      redis.disconnect();
    }
  }
  return { keys, memory };
}

function agentsRss(ctx: ScenarioContext): number {
  let rss = 0;
  for (const p of ctx.stack.state.processes) {
    if (!p.name.startsWith('agent') || p.pid === undefined) continue;
    try {
      const kb = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p.pid}/status`, 'utf8'))?.[1];
      rss += Number(kb ?? 0) * 1024;
    } catch {
      // gone
    }
  }
  return rss;
}

const mb = (bytes: number) => `${(bytes / 1_048_576).toFixed(1)} MB`;

/** 1,000,000 one-shot identities (30,000 short): keys and memory before, at the peak and after the idle TTL. */
export async function oneShotIdentities(ctx: ScenarioContext): Promise<Row> {
  const ttl = 5;
  // Each region's third of 4 holds more than the one token a one-shot identity spends.
  await ctx.stack.createPolicy('oneshot', { capacity: 4, refillPerSecond: 4, idleTtlSeconds: ttl });
  const agents = agentsOf(ctx);
  const total = ctx.short ? 30_000 : 1_000_000;
  const before = await redisFacts(ctx);
  const rssBefore = agentsRss(ctx);
  const answers = await paced(total, ctx.short ? 3000 : 6000, 256, (i) => ({
    url: agents[i % agents.length]!,
    body: { policy: 'oneshot', subject: `id-${i}` },
  }));
  const peak = await redisFacts(ctx);
  const rssPeak = agentsRss(ctx);
  // Expired keys go by Redis's own expiry, a sample at a time: wait (bounded) until the memory is back within
  // 10% of where it started, the promise checked below, and say how long that took.
  const peakAt = Date.now();
  let after = await redisFacts(ctx);
  // Not back in time is a finding of the row below, not an error here.
  await eventually(
    async () => {
      after = await redisFacts(ctx);
      return after.memory <= before.memory * 1.1;
    },
    (ttl + 120) * 1000,
    'Redis memory back within 10%',
    1000,
  ).catch(() => undefined);
  const returnedS = Math.round((Date.now() - peakAt) / 1000);
  const rssAfter = agentsRss(ctx);
  const row = summarize(
    `${total.toLocaleString('en-US')} one-shot identities`,
    answers,
    () => 1,
    null,
    (a) =>
      a.status === 200 && !a.allowed ? `fresh identity denied${a.reason ? ` (${a.reason})` : ''}` : undefined,
  );
  row.notes =
    `Redis keys ${before.keys} → ${peak.keys} at the peak → ${after.keys} ${returnedS} s later (idle TTL ${ttl} s); ` +
    `used_memory ${mb(before.memory)} → ${mb(peak.memory)} → ${mb(after.memory)}; ` +
    `agents' RSS ${mb(rssBefore)} → ${mb(rssPeak)} → ${mb(rssAfter)}`;
  if (after.memory > before.memory * 1.1)
    row.problems.push(`used_memory did not return within 10% (${mb(before.memory)} → ${mb(after.memory)})`);
  return row;
}

/** Every region bursts at the same instant, a minute boundary (a second boundary short). */
export async function synchronizedBursts(ctx: ScenarioContext): Promise<Row> {
  const C = 10;
  const R = 1;
  await ctx.stack.createPolicy('minute', { capacity: C, refillPerSecond: R });
  const agents = agentsOf(ctx);
  const tenants = 50;
  const perTenant = 3 * C;
  const boundary = ctx.short ? 1000 : 60_000;
  await new Promise((r) => setTimeout(r, boundary - (Date.now() % boundary)));
  const started = performance.now();
  const answers = await Promise.all(
    Array.from({ length: tenants * perTenant }, (_, i) =>
      decide(pool, agents[i % agents.length]!, { policy: 'minute', subject: `t-${i % tenants}` }),
    ),
  );
  const window = (performance.now() - started) / 1000;
  const row = summarize(
    `synchronized bursts at a ${ctx.short ? 'second' : 'minute'} boundary, ${tenants} tenants × 3 regions`,
    answers,
    () => 1,
    Math.floor(tenants * (C + R * window)),
    failureDenial,
  );
  const perSubject = new Map<number, number>();
  answers.forEach((a, i) => a.allowed && perSubject.set(i % tenants, (perSubject.get(i % tenants) ?? 0) + 1));
  const worst = Math.max(0, ...perSubject.values());
  if (worst > Math.floor(C + R * window)) row.problems.push(`a tenant was admitted ${worst} > ${C} + ${R}·W`);
  return row;
}

/** Costs of 1 and 50 mixed on one tenant; admitted tokens stay within C + R·W. */
export async function weightedCosts(ctx: ScenarioContext): Promise<Row> {
  const C = 600;
  const R = 30;
  const seconds = ctx.short ? 3 : 20;
  await ctx.stack.createPolicy('weighted', { capacity: C, refillPerSecond: R, maxCost: 50 });
  const agents = agentsOf(ctx);
  const total = (ctx.short ? 300 : 2000) + 0;
  const cost = (i: number) => (i % 5 === 0 ? 50 : 1);
  const started = performance.now();
  const answers = await paced(total, total / seconds, 64, (i) => ({
    url: agents[i % agents.length]!,
    body: { policy: 'weighted', subject: 'weighted-tenant', cost: cost(i) },
  }));
  const window = (performance.now() - started) / 1000;
  return summarize(
    `weighted costs (1 and 50 mixed), ${seconds} s, tokens`,
    answers,
    (_a, i) => cost(i),
    Math.floor(C + R * window),
    failureDenial,
  );
}

/** A child process; resolves with its first line of output. */
function child(
  args: string[],
  env: Record<string, string>,
): { proc: ChildProcess; firstLine: Promise<string> } {
  const proc = spawn(process.execPath, ['--import', 'tsx', ...args], {
    cwd: ROOT,
    env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? '/root', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const firstLine = new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const nl = out.indexOf('\n');
      if (nl >= 0) resolve(out.slice(0, nl).trim());
    });
    proc.once('exit', (code) => reject(new Error(`${args[0] ?? ''} exited with ${String(code)}`)));
  });
  return { proc, firstLine };
}

async function stop(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  await exited;
}

/**
 * 20 ms added to every Redis round trip (a TCP proxy adding 10 ms each way) under one agent: nothing opens and
 * no decision is late. The proxy and the agent run as processes of their own, as they would in production.
 */
export async function redisLatency(ctx: ScenarioContext): Promise<Row> {
  await using redis = await processBackend.startRedis();
  const spec: ProxySpec = {
    links: [{ name: 'redis', target: { host: redis.host, port: redis.port }, delayMs: 10 }],
  };
  const proxy = child([PROXY_MAIN, JSON.stringify(spec)], {});
  const policiesFile = join(tmpdir(), `qp-load-latency-${process.pid}.json`);
  writeFileSync(policiesFile, JSON.stringify({ policies: { slow: { capacity: 50, refillPerSecond: 5 } } }));
  const port = await freePort();
  let agent: ChildProcess | undefined;
  try {
    const proxyPort = (JSON.parse(await proxy.firstLine) as ProxyPorts).links['redis']!;
    agent = child(['regional-agent/main.ts'], {
      QP_REGION: 'lat',
      QP_REDIS_URL: `redis://127.0.0.1:${proxyPort}`,
      QP_POLICIES_FILE: policiesFile,
      QP_PORT: String(port),
      QP_LOG_LEVEL: 'warn',
      // Three round trips and more, as docs/running.md advises for a Redis this far (the agent warns below that).
      QP_STORE_TIMEOUT_MS: '100',
    }).proc;
    await waitForPort('127.0.0.1', port, 30_000);
    const url = `http://127.0.0.1:${port}`;
    // Ready, as a load balancer would wait for: its calls then carry their deadlines into the script.
    await eventually(
      async () => (await fetch(`${url}/readyz`).catch(() => undefined))?.status === 200,
      30_000,
      'the agent behind the slow link ready',
    );
    const tenants = 200;
    const rate = ctx.short ? 500 : 1000;
    const total = ctx.short ? 1000 : 10_000;
    const started = performance.now();
    const answers = await paced(total, rate, 128, (i) => ({
      url,
      body: { policy: 'slow', subject: `lat-${i % tenants}` },
    }));
    const window = (performance.now() - started) / 1000;
    const row = summarize(
      'Redis latency injection (+20 ms a round trip)',
      answers,
      () => 1,
      Math.floor(tenants * (50 + 5 * window)),
      failureDenial,
    );
    const opened = await metric(url, /^quotaplane_store_breaker_transitions_total\{state="open"\} (\d+)$/m);
    if (opened > 0) row.problems.push(`the breaker opened ${opened} times`);
    return row;
  } finally {
    if (agent !== undefined) await stop(agent);
    await stop(proxy.proc);
  }
}

/** A client that ignores Retry-After and retries in a tight loop, beside a polite tenant. */
export async function ignoresRetryAfter(ctx: ScenarioContext): Promise<Row> {
  const C = 20;
  const R = 2;
  await ctx.stack.createPolicy('polite', { capacity: C, refillPerSecond: R });
  const agents = agentsOf(ctx);
  const seconds = ctx.short ? 3 : 20;
  const started = performance.now();
  const answers: Answer[] = [];
  const politeAnswers: Answer[] = [];
  const stopAt = started + seconds * 1000;
  const greedy = async (k: number) => {
    // Bounded: the loop stops at its deadline whatever the answers say.
    while (performance.now() < stopAt) {
      answers.push(await decide(pool, agents[k % agents.length]!, { policy: 'polite', subject: 'greedy' }));
    }
  };
  const polite = async () => {
    for (let i = 0; performance.now() < stopAt; i++) {
      const a = await decide(pool, agents[0]!, { policy: 'polite', subject: `polite-${i % 50}` });
      politeAnswers.push(a);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  await Promise.all([...Array.from({ length: 16 }, (_, k) => greedy(k)), polite()]);
  const window = (performance.now() - started) / 1000;
  const row = summarize(
    `client ignoring Retry-After in a tight loop, ${seconds} s`,
    answers,
    () => 1,
    Math.floor(C + R * window),
    failureDenial,
  );
  const politeDenied = politeAnswers.filter((a) => a.status === 200 && !a.allowed).length;
  if (politeDenied > 0) {
    row.falseDenials['polite tenant denied'] = politeDenied;
    row.problems.push(`${politeDenied} polite tenant decisions denied`);
  }
  return row;
}

export const scenarios: readonly ((ctx: ScenarioContext) => Promise<Row>)[] = [
  campaign,
  hotTenant,
  oneShotIdentities,
  synchronizedBursts,
  weightedCosts,
  redisLatency,
  ignoresRetryAfter,
];

export function closeLoadPool(): void {
  pool.destroy();
}
