/**
 * `npx tsx bench/decision-path.ts [--batch 25] [--requests 1000] [--reps 5]`
 *
 * The agent's decision path alone: `POST /v1/decisions/batch` through Fastify's `inject` (no socket) on the
 * in-memory model store (no Redis), one token-bucket policy, subjects spread over 10,000. Prints this process's CPU
 * per decision, the least and the median of `--reps` runs of `--requests` batches each: with no other process in
 * the loop and no I/O, it moves little with what else the machine does, so it shows changes to the path's own
 * cost that the end-to-end benches (bench/service.bench.ts, bench/profile-service.ts) cannot tell from noise.
 * For where the time goes: `node --cpu-prof --import tsx bench/decision-path.ts`.
 */
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { systemClock } from '../core/clock.js';
import { parsePolicy } from '../core/policy/policy.js';
import { StaticShareView } from '../core/shares/shares.js';
import { buildApp } from '../regional-agent/app.js';
import { AgentConfig } from '../regional-agent/config.js';
import { ModelDecisionStore } from '../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../regional-agent/policies/static-policy-source.js';

const { values } = parseArgs({
  options: {
    batch: { type: 'string', default: '25' },
    requests: { type: 'string', default: '1000' },
    reps: { type: 'string', default: '5' },
  },
});
const batch = Number(values.batch);
const requests = Number(values.requests);
const reps = Number(values.reps);
const built = buildApp(
  {
    store: new ModelDecisionStore(systemClock),
    policies: new StaticPolicySource([
      parsePolicy({ name: 'service', capacity: 100, refillPerSecond: 100 / 60 }),
    ]),
    shares: new StaticShareView({}, 1),
    log: pino({ level: 'silent' }),
  },
  // As the benches run the agent: no sampled decision logs, no in-flight bound in the way.
  AgentConfig.parse({
    region: 'bench',
    redisUrl: 'redis://unused',
    policiesFile: 'unused',
    decisionDeadlineMs: 5000,
    storeTimeoutMs: 5000,
    reservationSweepMs: 0,
    maxInFlight: 100_000,
    logSampleRate: 0,
  }),
);
await built.ready;
const bodies = Array.from(
  { length: 256 },
  (_, k) =>
    `{"decisions":[${Array.from(
      { length: batch },
      (_, j) => `{"policy":"service","subject":"t${(k * batch + j * 7919) % 10_000}"}`,
    ).join(',')}]}`,
);
async function run(n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const r = await built.app.inject({
      method: 'POST',
      url: '/v1/decisions/batch',
      headers: { 'content-type': 'application/json' },
      payload: bodies[i % bodies.length]!,
    });
    if (r.statusCode !== 200) throw new Error(`batch answered ${r.statusCode}: ${r.body}`);
  }
}
await run(2 * requests);
const runs: number[] = [];
for (let rep = 0; rep < reps; rep++) {
  const before = process.cpuUsage();
  await run(requests);
  const used = process.cpuUsage(before);
  runs.push((used.user + used.system) / (requests * batch));
}
runs.sort((a, b) => a - b);
console.log(
  `decision path, batches of ${batch}: CPU µs per decision least ${runs[0]!.toFixed(2)}, median ` +
    `${runs[Math.floor(runs.length / 2)]!.toFixed(2)} (${reps} runs of ${requests} batches)`,
);
await built.app.close();
