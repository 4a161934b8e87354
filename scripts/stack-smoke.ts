/**
 * `node --import tsx scripts/stack-smoke.ts`: check a running stack end to end, whoever started it (`npm start`, docker compose):
 * every service ready, the demo policy present (created if not), one decision through each region's agent, a
 * budget change through the admin API, that change seen by every agent, and one gRPC rate-limit call per agent. Reads the same variables as the
 * launcher and docker-compose.multiregion.yml (QP_STACK_HOST, QP_STACK_*_PORT, QP_ADMIN_TOKEN). Exit 0 when
 * every step passed, 1 at the first that did not (named), 2 for a bad environment.
 */
import { rlsClient } from '../regional-agent/grpc/rls-client.js';
import { loadStackConfig, StackConfigError } from './stack/config.js';
import { until } from './stack/probes.js';
import { DEMO_POLICY, seedDemoPolicy } from './stack/seed.js';

interface Decision {
  allowed: boolean;
  results: { limit: number; remaining: number; reason?: string }[];
}

const say = (line: string) => process.stdout.write(`${line}\n`);

async function decide(agent: string, subject: string, dryRun: boolean): Promise<Decision | undefined> {
  const r = await fetch(`${agent}/v1/decisions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ policy: DEMO_POLICY.name, subject, dryRun }),
    signal: AbortSignal.timeout(5000),
  }).catch(() => undefined);
  if (r?.status !== 200) {
    await r?.body?.cancel();
    return undefined;
  }
  return (await r.json()) as Decision;
}

/**
 * Run `attempt` again, up to five times half a second apart, while its answer says the limiter could not decide
 * (`unavailable`): a store call that missed its deadline on a busy machine is a true answer, not a wiring fault,
 * but it is said in a line. Returns the last answer.
 */
async function despiteUnavailable<T>(
  attempt: () => Promise<T>,
  unavailable: (answer: T) => boolean,
  what: string,
): Promise<T> {
  let answer = await attempt();
  for (let tries = 1; tries < 5 && unavailable(answer); tries++) {
    say(`note ${what}: the limiter could not decide (a store call missed its deadline); asking again`);
    await new Promise((r) => setTimeout(r, 500));
    answer = await attempt();
  }
  return answer;
}

/** Whether a rate-limit response's problem body says the limiter could not decide (LIMITER_UNAVAILABLE). */
function unavailableBody(body: Uint8Array | undefined): boolean {
  if (body === undefined) return false;
  try {
    return (JSON.parse(new TextDecoder().decode(body)) as { code?: unknown }).code === 'LIMITER_UNAVAILABLE';
  } catch {
    return false;
  }
}

async function readyz(url: string): Promise<boolean> {
  const r = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) }).catch(() => undefined);
  await r?.body?.cancel();
  return r?.status === 200;
}

async function main(): Promise<void> {
  let config;
  try {
    config = loadStackConfig(process.env);
  } catch (error) {
    if (error instanceof StackConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(2);
    }
    throw error;
  }
  const token = config.adminToken;
  if (token === undefined) {
    process.stderr.write('QP_ADMIN_TOKEN is required: the smoke test changes a budget\n');
    process.exit(2);
  }
  const timeoutMs = config.readyTimeoutMs;
  const coordinator = `http://${config.host}:${config.coordinatorPort}`;
  const agents = config.regions.map((r) => ({ region: r.name, url: `http://${config.host}:${r.agentPort}` }));
  const run = Date.now().toString(36);

  await until(() => readyz(coordinator), timeoutMs, `coordinator ${coordinator} never became ready`);
  say(`ok  coordinator ready at ${coordinator}`);
  const seed = await seedDemoPolicy(coordinator, token);
  const capacity = Number(seed.policy['capacity']);
  say(`ok  demo policy ${seed.created ? 'created' : 'present'}: capacity ${capacity}`);

  // Dry runs report no demand, so the shares stay put while the test looks and while the change propagates;
  // real decisions come last.
  const probe = async (url: string) => (await decide(url, `smoke-probe-${run}`, true))?.results[0]?.limit;
  const before = new Map<string, number>();
  for (const { region, url } of agents) {
    await until(() => readyz(url), timeoutMs, `agent ${region} ${url} never became ready`);
    let limit: number | undefined;
    await until(
      async () => (limit = await probe(url)) !== undefined,
      timeoutMs,
      `agent ${region} never decided on the demo policy`,
    );
    if (!(limit! > 0 && limit! <= capacity)) {
      throw new Error(`agent ${region} enforces limit ${limit}, outside (0, ${capacity}]`);
    }
    before.set(region, limit!);
    say(`ok  agent ${region} at ${url}: ready, enforces limit ${limit} of ${capacity}`);
  }
  const sum = [...before.values()].reduce((a, b) => a + b, 0);
  if (sum > capacity + 1e-6) throw new Error(`regions enforce ${sum} together, above the budget ${capacity}`);
  say(`ok  regions enforce ${sum} together, within the budget ${capacity}`);

  const patch = await fetch(`${coordinator}/v1/policies/${DEMO_POLICY.name}/budget`, {
    method: 'PATCH',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ capacity: capacity * 2 }),
    signal: AbortSignal.timeout(10_000),
  });
  if (patch.status !== 200) throw new Error(`budget PATCH answered ${patch.status}: ${await patch.text()}`);
  say(`ok  budget PATCH: capacity ${capacity} -> ${capacity * 2}`);
  for (const { region, url } of agents) {
    const want = 2 * before.get(region)!;
    let seen: number | undefined;
    await until(
      async () => {
        seen = await probe(url);
        return seen !== undefined && Math.abs(seen - want) <= 1;
      },
      30_000,
      `agent ${region} never enforced the new budget (limit ${seen}, expected ${want})`,
    );
    say(`ok  agent ${region} enforces limit ${seen} after the change`);
  }

  for (const { region, url } of agents) {
    const decision = await despiteUnavailable(
      () => decide(url, `smoke-${region}-${run}`, false),
      (d) => d?.results[0]?.reason === 'store_unavailable',
      `agent ${region} decision`,
    );
    const result = decision?.results[0];
    if (decision?.allowed !== true || result === undefined) {
      throw new Error(`agent ${region} did not admit a first request: ${JSON.stringify(decision)}`);
    }
    say(`ok  agent ${region}: a decision, allowed, remaining ${result.remaining} of ${result.limit}`);
  }

  // Envoy's rate-limit service on each agent's gRPC listener, with the default descriptor rule.
  for (const region of config.regions) {
    const url = `grpc://${config.host}:${region.grpcPort}`;
    const client = rlsClient(url);
    try {
      const entries = [
        { key: 'policy', value: DEMO_POLICY.name },
        { key: 'subject', value: `smoke-grpc-${region.name}-${run}` },
      ];
      const r = await despiteUnavailable(
        () => client.shouldRateLimit({ domain: 'smoke', descriptors: [{ entries }] }, 5000),
        (answer) => answer.overall_code !== 'OK' && unavailableBody(answer.raw_body),
        `agent ${region.name} gRPC`,
      );
      if (r.overall_code !== 'OK') throw new Error(`agent ${region.name} gRPC answered ${JSON.stringify(r)}`);
      say(`ok  agent ${region.name} at ${url}: ShouldRateLimit OK, ${r.statuses[0]?.limit_remaining} left`);
    } finally {
      client.close();
    }
  }
  say('smoke test passed');
}

main().catch((error: unknown) => {
  process.stderr.write(`smoke test failed: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
