/**
 * What the launcher prints once the stack is ready: every endpoint, the tokens, the demo policy, where the logs
 * are, and two commands to try.
 */
import type { Stack } from './launcher.js';
import { DEMO_POLICY } from './seed.js';

export function banner(stack: Stack, tokenSources: { admin: boolean; read: boolean }): string {
  const { config, tokens } = stack;
  const state = stack.state();
  const pad = (s: string) => s.padEnd(20);
  const first = config.regions[0]!;
  const lines = [
    '',
    'quotaplane stack is ready',
    `  ${pad('coordinator admin')}${stack.coordinatorUrl}   (OpenAPI: ${stack.coordinatorUrl}/docs)`,
    ...config.regions.map(
      (r) =>
        `  ${pad(`agent ${r.name}`)}${stack.agentUrl(r)}   ${stack.grpcUrl(r)}   (Redis: ${state.redis[r.name]})`,
    ),
    ...(state.geo === undefined
      ? [`  ${pad('nats')}${state.nats}   (JetStream, namespace "${config.namespace}")`]
      : [
          ...Object.entries(state.geo.nats).map(
            ([region, url]) =>
              `  ${pad(`nats ${region}`)}${url}   (monitoring ${state.geo!.monitoring[region]})${url === state.nats ? '   coordinator' : ''}`,
          ),
          `  ${pad('topology')}geo: one NATS cluster, routes through links of ${state.geo.roundTrips.replace(/,/g, ', ')} ms round trip, ±${Math.round(state.geo.jitter * 100)} % jitter`,
          `  ${pad('links')}${state.geo.links}/links   (POST /partition/ap, /heal/ap; PUT /round-trip/us/ap)`,
        ]),
    `  ${pad('servers')}${state.servers}`,
    `  ${pad('services')}${config.runtime === 'compiled' ? 'compiled JavaScript from dist/ (npm run build)' : 'TypeScript through tsx'}`,
    `  ${pad('admin token')}${tokens.admin}${tokenSources.admin ? '   (from QP_ADMIN_TOKEN)' : '   (generated)'}`,
    `  ${pad('read token')}${tokens.read}${tokenSources.read ? '   (from QP_READ_TOKEN)' : '   (generated)'}`,
    `  ${pad('nats auth')}TLS and one nkey per process (${state.secretsDir}, kept across runs)`,
    `  ${pad('subjects')}HMAC-hashed before Redis, NATS and logs (${config.hmacSecret !== undefined ? 'QP_HMAC_SECRET' : `secret in ${state.secretsDir}/subject-hmac.key`})`,
  ];
  const seed = stack.seed;
  if (seed !== undefined) {
    const p = seed.policy;
    lines.push(
      `  ${pad('demo policy')}"${String(p['name'])}": capacity ${String(p['capacity'])}, refill ${String(p['refillPerSecond'])}/s, shared by ${config.regions.length} regions${seed.created ? '' : ' (kept as stored)'}`,
    );
  }
  lines.push(`  ${pad('logs')}${stack.dataDir}/logs`);
  if (config.envFile !== undefined) {
    lines.push(
      `  ${pad('for another shell')}source ${config.envFile}   (the tokens, and QUOTAPLANE_URL for the CLI)`,
    );
  }
  lines.push(
    '',
    'Try:',
    `  curl -s ${stack.agentUrl(first)}/v1/decisions -H 'content-type: application/json' \\`,
    `    -d '{"policy":"${DEMO_POLICY.name}","subject":"tenant-1"}'`,
    `  curl -s -X PATCH ${stack.coordinatorUrl}/v1/policies/${DEMO_POLICY.name}/budget \\`,
    `    -H 'authorization: Bearer ${tokens.admin}' -H 'content-type: application/json' -d '{"capacity":180}'`,
    `  curl -s ${stack.coordinatorUrl}/v1/allocations -H 'authorization: Bearer ${tokens.read}'`,
    '',
    'Ctrl-C (or SIGTERM) stops every process the stack started.',
  );
  return lines.join('\n');
}
