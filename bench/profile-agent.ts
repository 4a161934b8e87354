/**
 * `npx tsx bench/profile-agent.ts [--seconds 10] [--rate 1500] [--redis-core 1] [--top 30] [--keep] [--batch N]
 *   [--no-prof]`
 *
 * The agent process (regional-agent/main.ts) under the http suite's load, profiled with `node --cpu-prof`: it
 * prints the agent's and Redis's CPU per decision over the measured run, then where the agent's time went in
 * that run (self time and inclusive time per function, and self time per package), as shares of its non-idle
 * samples. `--rate 0` loads it closed-loop (64 connections) instead of at a fixed rate. `--batch N` sends
 * `POST /v1/decisions/batch` of N decisions each instead (closed-loop on 8 connections, as the http suite's batched
 * figure; figures stay per decision). `--no-prof` runs the agent without the profiler (the CPU figures alone).
 *
 * The agent is pinned to core 1 and the load generator to core 0, as in the bench. Redis goes on core 1 too by
 * default (as in the bench); `--redis-core 0` moves it to the other core: V8's profiler samples wall time, so
 * time Redis runs while the agent waits in a socket write on the shared core shows up as that write's.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { processBackend } from '../test/harness/process-backend.js';
import { freePort, waitForPort } from '../test/harness/ports.js';
import {
  AGENT_MAIN,
  benchAgentEnv,
  canPin,
  cpuMs,
  load,
  pinPid,
  redisPid,
  spawnServer,
  stopServer,
  writeBenchPolicies,
} from './http.bench.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** Shares of non-idle time in [from, to] (µs of the profile's clock): self, inclusive and by package. */
export function summarize(
  profile: Profile,
  from: number,
  to: number,
): {
  busyMs: number;
  self: [string, number][];
  inclusive: [string, number][];
  packages: [string, number][];
} {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const root = fileURLToPath(new URL('..', import.meta.url));
  const name = (n: ProfileNode) => {
    const url = n.callFrame.url.replace(/^file:\/\//, '');
    const where = url.includes('/node_modules/')
      ? url.slice(url.lastIndexOf('/node_modules/') + 14)
      : url.startsWith(root)
        ? url.slice(root.length)
        : url;
    return `${n.callFrame.functionName || '(anonymous)'} ${where}${where === '' ? '' : `:${n.callFrame.lineNumber + 1}`}`;
  };
  const packageOf = (n: ProfileNode) => {
    const url = n.callFrame.url;
    const m = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
    if (m !== null) return m[1]!;
    if (url.startsWith('node:')) return url.split('/')[0]!;
    if (url.replace(/^file:\/\//, '').startsWith(root))
      return `(repo) ${
        url
          .replace(/^file:\/\//, '')
          .slice(root.length)
          .split('/')[0]
      }`;
    return n.callFrame.functionName || '(native)';
  };
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const packages = new Map<string, number>();
  let busy = 0;
  let at = profile.startTime;
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0;
    at += dt;
    const node = byId.get(id);
    if (at < from || at > to || node === undefined || node.callFrame.functionName === '(idle)') return;
    busy += dt;
    self.set(name(node), (self.get(name(node)) ?? 0) + dt);
    packages.set(packageOf(node), (packages.get(packageOf(node)) ?? 0) + dt);
    const seen = new Set<string>();
    for (let n: ProfileNode | undefined = node; n !== undefined; n = byId.get(parent.get(n.id) ?? -1)) {
      const key = name(n);
      if (seen.has(key)) continue;
      seen.add(key);
      inclusive.set(key, (inclusive.get(key) ?? 0) + dt);
    }
  });
  const shares = (m: Map<string, number>) =>
    [...m].map(([k, t]): [string, number] => [k, busy > 0 ? t / busy : 0]).sort((a, b) => b[1] - a[1]);
  return {
    busyMs: busy / 1000,
    self: shares(self),
    inclusive: shares(inclusive),
    packages: shares(packages),
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      seconds: { type: 'string', default: '10' },
      rate: { type: 'string', default: '1500' },
      'redis-core': { type: 'string', default: '1' },
      top: { type: 'string', default: '30' },
      keep: { type: 'boolean', default: false },
      batch: { type: 'string', default: '0' },
      'no-prof': { type: 'boolean', default: false },
    },
  });
  const seconds = Number(values.seconds);
  const rate = Number(values.rate);
  const top = Number(values.top);
  const batch = Number(values.batch);
  const profiled = !values['no-prof'];
  await using redis = await processBackend.startRedis();
  const pin = canPin();
  if (pin) {
    pinPid(redisPid(redis.host, redis.port), values['redis-core']);
    pinPid(process.pid, '0');
  }
  const dir = mkdtempSync(join(tmpdir(), 'qp-profile-'));
  const policiesFile = writeBenchPolicies(dir);
  const port = await freePort();
  const agent = spawnServer(
    [AGENT_MAIN],
    // Exit at once on SIGTERM, so the profile ends right after the measured run.
    { ...benchAgentEnv(redis.url, policiesFile, port), QP_DRAIN_DELAY_MS: '0' },
    pin,
    profiled ? ['--cpu-prof', '--cpu-prof-dir', dir] : [],
  );
  try {
    await waitForPort('127.0.0.1', port, 30_000);
    const url = `http://127.0.0.1:${port}`;
    const single = (i: number) => JSON.stringify({ policy: 'writes', subject: `tenant-${i % 10_000}` });
    const body =
      batch > 0
        ? (i: number) =>
            `{"decisions":[${Array.from({ length: batch }, (_, j) => single(i * batch + j)).join(',')}]}`
        : single;
    const run = (s: number, r?: number) =>
      batch > 0 ? load(url, s, body, undefined, '/v1/decisions/batch', 8) : load(url, s, body, r);
    await run(3);
    const rPid = redisPid(redis.host, redis.port);
    const before = [cpuMs(agent.pid!), cpuMs(rPid)];
    const started = Date.now();
    const measured = await run(seconds, rate > 0 ? rate : undefined);
    const decisions = measured.total * Math.max(1, batch);
    const after = [cpuMs(agent.pid!), cpuMs(rPid)];
    const per = (i: number) =>
      before[i] === undefined || after[i] === undefined
        ? 'n/a'
        : (((after[i] - before[i]) * 1000) / decisions).toFixed(1);
    const how = batch > 0 ? `batches of ${batch}` : rate > 0 ? `at ${rate}/s` : 'closed loop';
    console.log(
      `${Math.round(measured.rps * Math.max(1, batch))} decisions/s (${how}), p99 ${measured.p99} ms, ` +
        `${measured.non2xx} non-2xx; CPU per decision: agent ${per(0)} µs, Redis ${per(1)} µs`,
    );
    await stopServer(agent);
    if (!profiled) return;
    const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
    if (file === undefined) throw new Error('the agent wrote no profile');
    const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as Profile;
    // The profile's clock is the agent's own (µs); it ends at the agent's exit, right after the measured run.
    // The window is that run less a second at its start (the warm-up load ended just before it); idle samples
    // (the shutdown's among them) are left out anyway.
    const to = profile.endTime;
    const s = summarize(profile, to - (Date.now() - started) * 1000 + 1_000_000, to);
    const show = (title: string, rows: [string, number][]) => {
      console.log(`\n${title}`);
      for (const [k, share] of rows.slice(0, top))
        console.log(`${(share * 100).toFixed(1).padStart(5)}%  ${k}`);
    };
    console.log(`\n${Math.round(s.busyMs)} ms of samples in the measured window (idle excluded)`);
    show('by package', s.packages);
    show('self time', s.self);
    show('inclusive time', s.inclusive);
    if (values.keep) console.log(`\nprofile kept in ${join(dir, file)}`);
  } finally {
    if (pin) pinPid(process.pid, '0-1');
    await stopServer(agent);
    if (!values.keep) rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
