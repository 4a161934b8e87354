/**
 * The local stack's variables as docs/running.md's table shows them: the words of each row. The name and the
 * default come from `StackEnv` (`npm run docs:env` writes the table; test/unit/scripts/docs-env-tables.test.ts
 * fails when it is stale). Every schema field needs an entry here, in the order of the table, and so do the two
 * pass-through prefixes the launcher reads outside the schema.
 */
import type { VariableDoc } from '../../core/config/env-config.js';
import { STACK_REGIONS, type StackEnv, type StackRegion } from './config.js';

/** The pass-through prefixes: read by the launcher beside the schema, so their rows have no default. */
export const PASS_THROUGH_VARIABLES = ['QP_COORDINATOR_*', 'QP_AGENT_*'] as const;

type Upper<R extends string> = Uppercase<R>;
type PerRegion<P extends string> = `QP_STACK_${Upper<StackRegion>}_${P}`;

/** One row per region: `QP_STACK_US_PORT`, `QP_STACK_EU_PORT`, … with the region named in each meaning. */
function perRegion<P extends string>(
  suffix: P,
  meaning: (region: StackRegion) => string,
): Record<PerRegion<P>, VariableDoc> {
  return Object.fromEntries(
    STACK_REGIONS.map((r) => [`QP_STACK_${r.toUpperCase()}_${suffix}`, { meaning: meaning(r) }]),
  ) as Record<PerRegion<P>, VariableDoc>;
}

/** The geo links' variables, `QP_STACK_US_EU_LINK_PORT` …, one per ordered pair of regions. */
const links = Object.fromEntries(
  STACK_REGIONS.flatMap((from) =>
    STACK_REGIONS.filter((to) => to !== from).map((to) => [
      `QP_STACK_${from.toUpperCase()}_${to.toUpperCase()}_LINK_PORT`,
      {
        meaning: `geo: the link from \`${from}\` to \`${to}\`: ${from}'s NATS server dials it to reach ${to}'s`,
      },
    ]),
  ),
);

export const STACK_VARIABLES: Readonly<
  Record<keyof typeof StackEnv.shape | (typeof PASS_THROUGH_VARIABLES)[number], VariableDoc>
> = {
  QP_ADMIN_TOKEN: { meaning: "the coordinator's bearer token of the write role", unset: 'generated' },
  QP_READ_TOKEN: { meaning: "the coordinator's bearer token of the read role", unset: 'generated' },
  QP_STACK_COORDINATOR_PORT: { meaning: 'admin API' },
  ...perRegion('PORT', (r) => `the \`${r}\` agent`),
  ...perRegion('GRPC_PORT', (r) => `the \`${r}\` agent's gRPC rate-limit service (Envoy's RLS)`),
  ...perRegion(
    'REDIS_PORT',
    (r) => `the \`${r}\` region's Redis; a cluster region uses P, P+1, P+2 and their bus ports P+10000…`,
  ),
  QP_STACK_NATS_PORT: { meaning: 'NATS' },
  QP_STACK_CLUSTER_REGIONS: { meaning: 'regions on a local 3-master Redis Cluster, e.g. `eu` or `us,ap`' },
  QP_STACK_SENTINEL_REGIONS: {
    meaning:
      'regions whose Redis is a master, two replicas and three sentinels (ports P..P+2, sentinels P+10000..P+10002), e.g. `ap`; not with `QP_STACK_CLUSTER_REGIONS` for the same region',
  },
  QP_STACK_TOPOLOGY: {
    meaning:
      '`geo`: regions a WAN apart ([below](#regions-a-wan-apart-the-geo-topology)); `npm start -- --geo` sets it',
  },
  QP_STACK_RUNTIME: {
    meaning:
      '`compiled`: the services run from dist/ ([below](#compiled-services)); `source`: through tsx. `npm start` passes `--compiled`',
    note: '`compiled` under `npm start`',
  },
  QP_STACK_ROUND_TRIPS: { meaning: 'geo: round trip of each link between regions, ms' },
  QP_STACK_LINK_JITTER: {
    meaning: "geo: each chunk's one-way delay varies within ± this fraction, order kept",
  },
  ...perRegion('NATS_PORT', (r) => `geo: the \`${r}\` region's NATS server (clients)`),
  ...perRegion('ROUTE_PORT', (r) => `geo: the \`${r}\` server's route port (the links lead there)`),
  ...perRegion('MONITOR_PORT', (r) => `geo: the \`${r}\` server's HTTP monitoring (\`/routez\`, \`/jsz\`)`),
  ...(links as Record<`QP_STACK_${Upper<StackRegion>}_${Upper<StackRegion>}_LINK_PORT`, VariableDoc>),
  QP_STACK_LINKS_PORT: { meaning: "geo: the links' control API (partitions, round trips)" },
  QP_STACK_SERVERS: {
    meaning:
      '`binaries` (from PATH), `docker` (containers), `auto` (binaries if both are on PATH, else Docker)',
  },
  REDIS_IMAGE: { meaning: "Redis's image when the servers run in containers" },
  NATS_IMAGE: { meaning: "NATS's image when the servers run in containers" },
  QP_STACK_HOST: { meaning: 'address every process binds' },
  QP_KV_NAMESPACE: { meaning: 'JetStream namespace shared by the coordinator and the agents' },
  QP_STACK_SEED: { meaning: 'create the demo policy' },
  QP_STACK_READY_TIMEOUT_MS: { meaning: 'longest wait for the coordinator and for each agent to be ready' },
  QP_STACK_LOG_LEVEL: {
    meaning: "services' log level (their warnings and errors are also echoed to the console)",
  },
  QP_STACK_DATA_DIR: {
    meaning: 'data and logs of this run; a directory you name is kept',
    unset: 'a temporary directory',
  },
  QP_STACK_SECRETS_DIR: {
    meaning: 'NATS credentials and TLS material, the subject HMAC key: generated once, kept across runs',
    unset: '`.quotaplane/secrets` (in the repo)',
  },
  QP_HMAC_SECRET: {
    meaning: "the agents' subject secret (16+ characters) instead of the kept one",
    unset: 'the kept `subject-hmac.key`',
  },
  QP_STACK_KEEP_DATA: { meaning: 'keep the temporary directory after a clean stop' },
  QP_STACK_STATE_FILE: {
    meaning: 'write the endpoints and process ids there (JSON, no tokens) once ready; removed on stop',
  },
  QP_STACK_ENV_FILE: {
    meaning:
      'write the tokens and `QUOTAPLANE_URL` there (a shell file to `source`) once ready; removed on stop; empty: none',
  },
  'QP_COORDINATOR_*': {
    meaning: 'passed to the coordinator as `QP_*`: `QP_COORDINATOR_LEASE_MS=8000` sets its `QP_LEASE_MS`',
    unset: '—',
  },
  'QP_AGENT_*': {
    meaning: 'passed to every agent as `QP_*`: `QP_AGENT_DECISION_DEADLINE_MS=80`',
    unset: '—',
  },
};
