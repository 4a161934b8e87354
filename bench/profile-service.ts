/**
 * `npx tsx bench/profile-service.ts [--seconds 8] [--kind quotaplane|nogrants|direct] [--tenants zipf|uniform] [--top 25]
 *   [--no-prof] [--keep DIR]`
 *
 * The service bench's protected service (bench/service.bench.ts) and its agent under the same closed-loop load
 * (64 connections, Zipf or uniform tenants), both profiled with `node --cpu-prof`: CPU per request of the
 * service, the agent and Redis, then each process's top self-time functions and packages (shares of non-idle
 * samples, by bench/profile-agent.ts's summary), and the service's event-loop delay. `--no-prof` runs both without the profiler (the CPU figures
 * alone, without its overhead); `--keep DIR` copies the .cpuprofile files there (for DevTools or speedscope).
 *
 * With everything on one core, a process that writes to a socket often loses the core to the reader it woke:
 * the profiler counts that wait as busy time in `writev`/`writeUtf8String`, so those shares overstate CPU.
 */
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
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
import { summarize } from './profile-agent.js';
import { tenantSequence } from './service.bench.js';

const SERVICE = fileURLToPath(new URL('./service.bench.ts', import.meta.url));

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '8' },
    kind: { type: 'string', default: 'quotaplane' },
    tenants: { type: 'string', default: 'zipf' },
    top: { type: 'string', default: '25' },
    'no-prof': { type: 'boolean', default: false },
    keep: { type: 'string' },
  },
});
const seconds = Number(values.seconds);
const top = Number(values.top);
await using redis = await processBackend.startRedis();
const pin = canPin();
const rPid = redisPid(redis.host, redis.port);
if (pin) {
  pinPid(rPid, '1');
  pinPid(process.pid, '0');
}
const dir = mkdtempSync(join(tmpdir(), 'qp-profile-service-'));
const policiesFile = join(dir, 'policies.json');
writeFileSync(
  policiesFile,
  JSON.stringify({ policies: { service: { capacity: 100, refillPerSecond: 100 / 60 } } }),
);
function profFlags(into: string): string[] {
  return values['no-prof'] ? [] : ['--cpu-prof', '--cpu-prof-dir', into];
}
const [agentPort, port] = await Promise.all([freePort(), freePort()]);
const agentDir = join(dir, 'agent');
const serviceDir = join(dir, 'service');
const agent = spawnServer(
  [AGENT_MAIN],
  { ...defaultAgentEnv(redis.url, policiesFile, agentPort), QP_TERMS: 'on' },
  pin,
  profFlags(agentDir),
);
const service = spawnServer(
  [
    SERVICE,
    '--serve',
    values.kind,
    '--port',
    String(port),
    '--redis',
    redis.url,
    '--agent',
    `http://127.0.0.1:${agentPort}`,
  ],
  {},
  pin,
  profFlags(serviceDir),
);
try {
  await Promise.all([agentPort, port].map((p) => waitForPort('127.0.0.1', p, 30_000)));
  const tenants = tenantSequence(values.tenants === 'uniform' ? 'uniform' : 'zipf');
  let i = 0;
  const run = (duration: number, prefix: string) =>
    autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: 64,
      duration,
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
  await run(2, 'warm-');
  const pids = [service.pid!, agent.pid!, rPid];
  const before = pids.map(cpuMs);
  const started = Date.now();
  const r = await run(seconds, 'm-');
  const after = pids.map(cpuMs);
  const per = after.map((a, k) => (((a! - before[k]!) * 1000) / r.requests.total).toFixed(1));
  console.log(
    `${Math.round(r.requests.average)} requests/s, p99 ${r.latency.p99} ms, 2xx ${r['2xx']}, non2xx ${r.non2xx}; ` +
      `CPU µs per request: service ${per[0]} + agent ${per[1]} + Redis ${per[2]}`,
  );
  const elapsed = Date.now() - started;
  try {
    const { execFileSync } = await import('node:child_process');
    const stats = execFileSync('redis-cli', ['-u', redis.url, 'INFO', 'commandstats'], { encoding: 'utf8' });
    console.log(
      stats
        .split('\n')
        .filter((l) => /calls=\d{3,}/.test(l))
        .join('\n'),
    );
    const loop = (await (await fetch(`http://127.0.0.1:${port}/_loop`)).json()) as Record<string, number>;
    console.log(`service event-loop delay, ms: ${JSON.stringify(loop)}`);
    const s = (await (await fetch(`http://127.0.0.1:${port}/_stats`)).json()) as unknown;
    console.log(JSON.stringify(s));
  } catch {
    // Courtesy figures only.
  }
  await Promise.all([stopServer(service), stopServer(agent)]);
  for (const [name, d] of values['no-prof']
    ? []
    : ([
        ['service', serviceDir],
        ['agent', agentDir],
      ] as const)) {
    const file = readdirSync(d).find((f) => f.endsWith('.cpuprofile'));
    if (file === undefined) continue;
    if (values.keep !== undefined) {
      mkdirSync(values.keep, { recursive: true });
      copyFileSync(join(d, file), join(values.keep, `${name}.cpuprofile`));
    }
    const profile = JSON.parse(readFileSync(join(d, file), 'utf8')) as Parameters<typeof summarize>[0];
    const s = summarize(profile, profile.endTime - elapsed * 1000 - 1_000_000, profile.endTime);
    console.log(`\n== ${name}: ${Math.round(s.busyMs)} ms busy`);
    for (const [k, share] of s.packages.slice(0, 12))
      console.log(`${(share * 100).toFixed(1).padStart(5)}%  ${k}`);
    console.log('-- self');
    for (const [k, share] of s.self.slice(0, top))
      console.log(`${(share * 100).toFixed(1).padStart(5)}%  ${k}`);
  }
} finally {
  if (pin) pinPid(process.pid, '0-1');
  await Promise.all([stopServer(service), stopServer(agent)]);
  rmSync(dir, { recursive: true, force: true });
}
