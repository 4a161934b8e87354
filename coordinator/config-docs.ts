/**
 * The coordinator's variables as the tables of docs/coordinator.md and docs/protocol.md (`page: 'protocol'`)
 * show them: the words of each row. The name and the default come from `CoordinatorEnv` (`npm run docs:env`
 * writes the tables; test/unit/scripts/docs-env-tables.test.ts fails when one is stale). Every variable needs an entry
 * here, in the order of its table; `QP_ADMIN_TOKENS_FILE` is read by `loadConfig`, outside the schema.
 */
import type { VariableDoc } from '../core/config/env-config.js';
import type { CoordinatorEnv } from './config.js';

export const COORDINATOR_VARIABLES: Readonly<
  Record<keyof typeof CoordinatorEnv.shape | 'QP_ADMIN_TOKENS_FILE', VariableDoc>
> = {
  QP_REGIONS: {
    meaning:
      "comma-separated regions the coordinator allocates to, e.g. `us,eu,ap`; a policy's `homeRegion` must be one",
    unset: '(required)',
  },
  QP_ADMIN_TOKEN: {
    meaning: 'bearer token of the `write` role, named `admin`; 16-512 printable ASCII characters',
    unset: '(required unless named)',
  },
  QP_READ_TOKEN: {
    meaning: 'bearer token of the `read` role, named `reader`; must differ from the admin token',
  },
  QP_ADMIN_TOKENS: {
    meaning: 'named tokens `name:role:token` (role `read` or `write`), separated by commas or new lines',
  },
  QP_ADMIN_TOKENS_FILE: {
    meaning: 'a file of named tokens, one a line (`#` starts a comment), added to `QP_ADMIN_TOKENS`',
  },
  QP_METRICS_AUTH: { meaning: '`read`: `/metrics` needs a read or write token' },
  QP_METRICS_PORT: {
    meaning: 'serve `/metrics` on a listener of its own (and not on the admin one); `0` picks a free port',
  },
  QP_METRICS_HOST: { meaning: 'address of that listener', unset: '`QP_HOST`' },
  QP_AUDIT_REFUSALS_WINDOW_MS: {
    meaning:
      'refused requests are audited once per source, reason and token name per window, with their count',
  },
  QP_AUDIT_REFUSALS_PER_MINUTE: {
    meaning:
      'most refusal records per minute; further groups are counted in `qp_coord_audit_refusals_dropped_total`',
  },
  QP_NATS_URL: { meaning: 'comma-separated NATS servers (JetStream enabled)' },
  QP_NATS_NKEY_FILE: {
    meaning:
      "the coordinator's nkey seed file: the coordinator's NATS permissions ([security.md](security.md))",
    unset: 'none (anonymous)',
  },
  QP_NATS_TLS_CA_FILE: {
    meaning: 'CA certificate (PEM) trusted for `tls://` NATS URLs',
    unset: 'system CAs',
  },
  QP_HOST: { meaning: 'listen address' },
  QP_PORT: { meaning: 'listen port' },
  QP_LOG_LEVEL: { meaning: '`fatal`, `error`, `warn`, `info`, `debug`, `trace`, `silent`' },
  QP_KV_NAMESPACE: {
    meaning: 'prefix of every JetStream bucket, stream and subject (agents must use the same)',
  },
  QP_NATS_TIMEOUT_MS: { meaning: 'deadline of one JetStream request; past it the API answers 503' },
  QP_KV_REPLICAS: {
    meaning: 'replicas of the buckets and the audit stream (1-5); 3 over three regions survives losing one',
  },
  QP_LEADER_LEASE_MS: {
    meaning:
      'leader lease ([high availability](#high-availability)); a standby leads within about this; `0`: off',
  },
  QP_COORDINATOR_NAME: {
    meaning: "this coordinator's name in the leader lease (1-64 chars of `A-Z a-z 0-9 _ . : -`)",
    unset: '`<host>-<pid>-<rand>`',
  },
  QP_MAX_POLICIES: {
    meaning: 'most policies the store holds; one more is refused with 409 `COORD_ERR_POLICY_LIMIT`',
  },
  QP_BODY_LIMIT_BYTES: { meaning: 'largest request body; larger ones get 413 `COORD_ERR_BODY_TOO_LARGE`' },
  QP_RESTORE_LIMIT_BYTES: {
    meaning:
      'largest `POST /v1/restore` body (64 MiB: a backup of 1000 policies and 100k audit records fits)',
  },
  QP_AUDIT_MAX_RECORDS: { meaning: 'audit trail bound: record count' },
  QP_AUDIT_MAX_AGE_DAYS: { meaning: 'audit trail bound: age' },
  QP_AUDIT_MAX_BYTES: {
    meaning: 'audit trail bound: bytes (oldest records go first when any bound is reached)',
  },
  QP_SHUTDOWN_GRACE_MS: {
    meaning: 'time between turning not-ready and closing the listener (give load balancers time to notice)',
  },
  QP_ROUND_MS: { meaning: 'rebalance round', page: 'protocol' },
  QP_REPORT_INTERVAL_MS: {
    meaning: 'heartbeat and usage interval (agents follow what renewals say)',
    page: 'protocol',
  },
  QP_LEASE_MS: {
    meaning:
      "lease length from the heartbeat's send time; at least 3 × `QP_REPORT_INTERVAL_MS` + `QP_SKEW_MS`",
    page: 'protocol',
  },
  QP_GRACE_MS: {
    meaning:
      'how long a lapsed agent keeps min(issued, safe) before settling at safe; must exceed `QP_LEASE_MS + 2·QP_SKEW_MS + QP_ROUND_MS`',
    page: 'protocol',
  },
  QP_SKEW_MS: { meaning: 'margin for clocks running at different rates', page: 'protocol' },
  QP_SAFE_SHARES: {
    meaning: 'e.g. `us=0.5,eu=0.25,ap=0.25`; every region, sum ≤ 1',
    unset: 'equal split',
    page: 'protocol',
  },
  QP_MAX_OVERRIDES: {
    meaning: 'per-subject overrides per policy (0: off; borrowing is the per-subject mechanism)',
    page: 'protocol',
  },
  QP_CONFIRM_MS: {
    meaning:
      'how long a target must stay beyond the hysteresis band (with room needed) before a move at rest',
    page: 'protocol',
  },
  QP_MAX_STEP: {
    meaning: "largest shrink of any region's share in one step, (0, 1]; 1 leaves steps to `damping` alone",
    page: 'protocol',
  },
  QP_OVERRIDE_TTL_MS: { meaning: 'quiet time before an override reverts', page: 'protocol' },
  QP_FORGET_AFTER_MS: {
    meaning: 'forget an agent silent this long (see Forgetting agents)',
    page: 'protocol',
  },
  QP_MAX_AGENTS_PER_REGION: {
    meaning: 'registered agents per region; heartbeats of further new agents are refused',
    page: 'protocol',
  },
};
