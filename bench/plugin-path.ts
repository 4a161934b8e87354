/**
 * `npx tsx bench/plugin-path.ts [--src DIR[,DIR]] [--requests 20000] [--rounds 5] [--chunk 1000] [--concurrency 64]
 *   [--nogrants] [--direct] [--tenants zipf|uniform]`
 *
 * CPU the Fastify plugin and the client add to a protected request in the service's own process. For each `--src`
 * (a copy of packages/client/src at the same depth, e.g. `packages/client/src-base` holding a baseline; remove it
 * after, as lint takes it for the project's), one Fastify app in this process with the service bench's protected
 * route (`GET /work`, its policy, Zipf tenants) and its own client, against one real agent and Redis (other
 * processes, started as the service bench starts them); beside them the same route unprotected (`GET /free`).
 * All are driven by `inject` (`--concurrency` requests in flight) in interleaved chunks of `--chunk` requests, the
 * order turned each chunk (whichever runs first after another pays more), so load from elsewhere on the machine
 * falls on each alike. Each round prints process.cpuUsage per request of each route, and of each protected one
 * less the unprotected: what the plugin path costs (inject's own cost is the same on every route). `--direct` gives
 * each client direct decisions on the agent's Redis (the agent with terms on), as the service bench's `direct`
 * contender; their Redis client's work is in this process's CPU, Redis's own is not.
 */
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import Fastify, { type FastifyInstance } from 'fastify';
import { processBackend } from '../test/harness/process-backend.js';
import { freePort, waitForPort } from '../test/harness/ports.js';
import { AGENT_MAIN, defaultAgentEnv, spawnServer, stopServer } from './http.bench.js';
import { tenantOf, tenantSequence } from './service.bench.js';
import type * as ClientModule from '../packages/client/src/index.js';
import type * as PluginModule from '../packages/client/src/fastify.js';

const { values } = parseArgs({
  options: {
    src: { type: 'string', default: 'packages/client/src' },
    requests: { type: 'string', default: '20000' },
    rounds: { type: 'string', default: '5' },
    chunk: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '64' },
    nogrants: { type: 'boolean', default: false },
    direct: { type: 'boolean', default: false },
    tenants: { type: 'string', default: 'zipf' },
  },
});
const requests = Number(values.requests);
const chunk = Number(values.chunk);
const concurrency = Number(values.concurrency);
const sources = values.src.split(',');
const modules = await Promise.all(
  sources.map(async (s) => {
    const base = pathToFileURL(resolve(s) + '/').href;
    return {
      name: s,
      client: (await import(`${base}index.ts`)) as typeof ClientModule,
      plugin: (await import(`${base}fastify.ts`)) as typeof PluginModule,
    };
  }),
);

await using redis = await processBackend.startRedis();
const dir = mkdtempSync(join(tmpdir(), 'qp-plugin-path-'));
const policiesFile = join(dir, 'policies.json');
writeFileSync(
  policiesFile,
  JSON.stringify({ policies: { service: { capacity: 100, refillPerSecond: 100 / 60 } } }),
);
const agentPort = await freePort();
const agent = spawnServer(
  [AGENT_MAIN],
  { ...defaultAgentEnv(redis.url, policiesFile, agentPort), ...(values.direct ? { QP_TERMS: 'on' } : {}) },
  false,
);
const { Redis } = await import('ioredis');
const variants: { name: string; app: FastifyInstance; close: () => void; stats: () => unknown }[] = [];
const free = Fastify();
try {
  await waitForPort('127.0.0.1', agentPort, 30_000);
  for (const m of modules) {
    const direct = values.direct ? new Redis(redis.url) : undefined;
    const client = new m.client.AgentClient({
      baseUrl: `http://127.0.0.1:${agentPort}`,
      ...(values.nogrants ? { grants: false as const } : {}),
      ...(direct === undefined ? {} : { direct: { redis: direct } }),
    });
    const app = Fastify();
    await app.register(m.plugin.quotaplane, { client, subject: tenantOf });
    app.get('/work', { config: { quota: { policy: 'service' } } }, () => ({ ok: true }));
    await app.ready();
    variants.push({
      name: m.name,
      app,
      close: () => {
        void app.close();
        void client.closeAndDrain().then(() => direct?.disconnect());
      },
      stats: () => ({
        exchanges: client.stats().exchanges,
        grants: client.grantStats(),
        direct: client.directStats(),
      }),
    });
  }
  free.get('/free', () => ({ ok: true }));
  await free.ready();
  if (values.tenants !== 'zipf' && values.tenants !== 'uniform')
    throw new Error('--tenants: zipf or uniform');
  const tenants = tenantSequence(values.tenants);

  /** Requests `from` to `to` of the tenant sequence (with `prefix`) to `url` of `app`: CPU µs used, by status. */
  async function drive(
    app: FastifyInstance,
    url: string,
    prefix: string,
    from: number,
    to: number,
    codes: Record<number, number>,
  ): Promise<number> {
    let next = from;
    const worker = async () => {
      while (next < to) {
        const i = next++;
        const res = await app.inject({
          method: 'GET',
          url,
          headers: { 'x-tenant-id': `${prefix}${tenants[i % tenants.length]!}` },
        });
        codes[res.statusCode] = (codes[res.statusCode] ?? 0) + 1;
      }
    };
    const before = process.cpuUsage();
    await Promise.all(Array.from({ length: concurrency }, worker));
    const used = process.cpuUsage(before);
    return used.user + used.system;
  }

  const rounds = Number(values.rounds);
  for (let r = -1; r < rounds; r++) {
    // Round -1 warms every path up; each round's tenants are new to the agent (same sequence for every variant).
    const us = new Map<string, number>();
    const codes = new Map<string, Record<number, number>>();
    for (let at = 0; at < requests; at += chunk) {
      const to = Math.min(requests, at + chunk);
      const freeCodes = codes.get('free') ?? {};
      codes.set('free', freeCodes);
      us.set('free', (us.get('free') ?? 0) + (await drive(free, '/free', `f${r}-`, at, to, freeCodes)));
      // Each chunk takes the variants in the other order: whichever runs first after another pays more.
      const order = [...variants.entries()];
      if ((at / chunk) % 2 === 1) order.reverse();
      for (const [k, v] of order) {
        const c = codes.get(v.name) ?? {};
        codes.set(v.name, c);
        us.set(v.name, (us.get(v.name) ?? 0) + (await drive(v.app, '/work', `v${k}r${r}-`, at, to, c)));
      }
    }
    if (r < 0) continue;
    const freeUs = us.get('free')! / requests;
    console.log(
      `round ${r}: unprotected ${freeUs.toFixed(1)} µs; ` +
        variants
          .map((v) => {
            const u = us.get(v.name)! / requests;
            return `${v.name} ${u.toFixed(1)} (plugin ${(u - freeUs).toFixed(1)}) µs ${JSON.stringify(codes.get(v.name))}`;
          })
          .join('; '),
    );
  }
  for (const v of variants) console.log(v.name, JSON.stringify(v.stats()));
} finally {
  for (const v of variants) v.close();
  await free.close();
  await stopServer(agent);
  rmSync(dir, { recursive: true, force: true });
}
