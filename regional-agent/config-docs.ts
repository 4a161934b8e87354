/**
 * The agent's variables as docs/agent.md's table shows them: the words of each row. The name and the default
 * come from `AgentConfig` (`npm run docs:env` writes the table; test/unit/scripts/docs-env-tables.test.ts fails when it
 * is stale). Every schema field needs an entry here, in the order of the table.
 */
import type { VariableDoc } from '../core/config/env-config.js';
import type { AgentConfig } from './config.js';

export const AGENT_VARIABLES: Readonly<Record<keyof typeof AgentConfig.shape, VariableDoc>> = {
  region: { meaning: 'region this agent serves (`us`, `eu-west`)', unset: 'required' },
  redisUrl: {
    meaning: 'one Redis, `redis://host:port/db`; exactly one of this, the cluster and the sentinels',
    unset: '—',
  },
  redisClusterNodes: { meaning: 'Redis Cluster seeds, `host:port,host:port`', unset: '—' },
  redisSentinels: {
    meaning:
      'Redis under Sentinel: the sentinels, `host:port,host:port`; the agent follows the master they name (running.md, "Redis high availability")',
    unset: '—',
  },
  redisMasterName: { meaning: "with `QP_REDIS_SENTINELS`: the monitored master's name", unset: '—' },
  redisWaitReplicas: {
    meaning:
      "replicas that must hold a decision's write before it is answered (Redis `WAIT`); a failover then forgets no answered admission. One Redis or Sentinel only",
  },
  redisWaitTimeoutMs: {
    meaning: "longest `WAIT`; fewer acknowledgements by then is a store failure (the policy's failure mode)",
  },
  natsUrl: { meaning: "the coordinator's NATS: policies from its KV, shares from its leases" },
  natsNkeyFile: {
    meaning: "this agent's nkey seed file: its region's NATS permissions (security.md)",
    unset: 'none (anonymous)',
  },
  natsTlsCaFile: { meaning: 'CA certificate (PEM) trusted for `tls://` NATS URLs', unset: 'system CAs' },
  kvNamespace: { meaning: "the coordinator's JetStream namespace (`QP_KV_NAMESPACE` there)" },
  policiesAcceptEmpty: {
    meaning:
      "apply a reload of the coordinator's policies that finds neither a policy nor a deletion (a lost bucket); off: keep the last good ones",
  },
  instance: { meaning: 'stable, unique name of this agent for the coordinator', unset: '`<host>:<port>`' },
  policiesFile: { meaning: 'standalone: policies file; exactly one of this and `QP_NATS_URL`', unset: '—' },
  policiesWatch: { meaning: 'reload the file when it changes (SIGHUP always reloads)' },
  decisionDeadlineMs: { meaning: "longest a decision waits for a strict policy's home region" },
  roundTrips: {
    meaning:
      'round trips to the other regions, ms (`us-eu=70,us-ap=150`): strict and loan waits cover them ([protocol](protocol.md#timings-at-a-distance))',
  },
  storeTimeoutMs: {
    meaning:
      'longest a store call waits for its reply, on the wire from its write; a borrow keeps twice this after its loans (credit, then decision), so keep it well under decisionDeadlineMs or lenders get little time',
  },
  borrowing: {
    meaning:
      "borrow a subject's tokens from other regions on refusal and below the low-water mark (and lend them); needs a coordinator",
  },
  borrowLowWater: {
    meaning:
      'top a bucket up from other regions once an admission leaves it below this fraction of its capacity, 0..1 (0: only on refusal)',
  },
  borrowMaxLenders: { meaning: 'most regions asked per borrow round, 1..16 (refused above)' },
  borrowMemory: { meaning: 'dry-memory entries of the planner, 1..1,000,000 (refused above)' },
  borrowBackoffMs: { meaning: 'how long a lender region that did not answer is skipped' },
  explainRefusals: {
    meaning:
      '(policy, subject) pairs whose last refusal `GET /v1/explain` shows (LRU, in memory), 0..1,000,000 (refused outside; 0 keeps none)',
  },
  storeBatching: { meaning: '`batch` (one script call per slot per turn), `auto` (ioredis), or `off`' },
  maxInFlight: { meaning: 'decisions admitted and not yet answered; beyond, 503 AGT_ERR_OVERLOADED' },
  maxEventLoopDelayMs: { meaning: "shed while the event loop's delay exceeds this", note: 'off' },
  overloadRetryAfterMs: { meaning: '`Retry-After` of a shed request (whole seconds, rounded up)' },
  trustedProxies: { meaning: 'IPs/CIDRs that may ask forward-auth; their `X-Forwarded-For` is believed' },
  subjectHeader: { meaning: 'forward-auth subject header' },
  forwardAuthSecret: { meaning: '≥ 16 chars: then required in header `QP_FORWARD_AUTH_SECRET_HEADER`' },
  forwardAuthSecretHeader: { meaning: 'header carrying that secret' },
  requestIdHeader: { meaning: 'request id header, read (1-128 safe chars) and echoed' },
  hmacSecret: {
    meaning:
      '≥ 16 chars; subjects are HMAC-SHA256-hashed before keys, NATS and logs; the same for every agent; `npm start` generates one ([security.md](security.md#privacy))',
  },
  hmacSecretFile: {
    meaning:
      'a file holding `QP_HMAC_SECRET` (what `npm start` and the compose file pass); not with `QP_HMAC_SECRET`',
  },
  leaseTokenSecret: {
    meaning:
      '≥ 16 chars; key of the HMAC on concurrency lease tokens, the same for every agent of a region; without it or `QP_HMAC_SECRET`, random per process (a lease is released at its own agent, or runs out)',
    unset: 'from `QP_HMAC_SECRET`',
  },
  leaseTokenSecretFile: {
    meaning: 'a file holding `QP_LEASE_TOKEN_SECRET`; not with `QP_LEASE_TOKEN_SECRET`',
  },
  staticShares: { meaning: '`writes=0.5,reads=1` or a JSON object: shares until leases exist' },
  defaultShare: { meaning: 'share of policies not listed' },
  legacyHeaders: { meaning: 'also send `X-RateLimit-*`' },
  rateLimitHeaders: {
    meaning:
      'which revision of draft-ietf-httpapi-ratelimit-headers `RateLimit` follows: `draft-11` or `draft-10` ([headers](#headers-draft-ietf-httpapi-ratelimit-headers-11-or--10))',
  },
  terms: {
    meaning:
      '`on`: `POST /v1/terms` gives clients trusted with this Redis short terms to decide token buckets themselves; `off`: 404 `AGT_ERR_TERMS_OFF`',
  },
  termMs: {
    meaning:
      "longest term, 200..2000 ms (refused outside); acknowledgements of shrinks wait up to this long, so keep it well under the coordinator's acknowledgement deadline",
  },
  host: { meaning: 'listen address' },
  port: { meaning: 'listen port (the local stack uses 7101-7103)' },
  grpcPort: { meaning: 'gRPC rate-limit service for Envoy (0: any free port); unset: none' },
  grpcHost: { meaning: 'address the gRPC service binds', unset: '`QP_HOST`' },
  rlsRulesFile: { meaning: 'JSON descriptor rules ([proxies.md](proxies.md#descriptor-rules))' },
  rlsRules: { meaning: 'the same rules inline, as JSON', unset: 'one generic rule' },
  logLevel: { meaning: 'pino level' },
  logSampleRate: { meaning: 'fraction of decisions logged' },
  bodyLimitBytes: { meaning: 'largest body' },
  idempotencyTtlMs: { meaning: 'how long a retry replays' },
  idempotencyMaxRecords: {
    meaning: 'most live idempotency records per subject; writing one more deletes those closest to expiry',
  },
  maxLeaseMs: { meaning: 'longest lease a heartbeat reply may grant; a longer one is refused' },
  maxGraceMs: { meaning: 'longest grace period a reply may set' },
  maxReportIntervalMs: { meaning: 'longest report interval a reply may set (the shortest is 50 ms)' },
  breakerErrorPercent: { meaning: 'failed share of calls that opens the breaker' },
  breakerVolumeThreshold: { meaning: 'calls in the window before it may open' },
  breakerResetMs: { meaning: 'open time before a trial call; also the retry hint of fail-closed denials' },
  breakerWindowMs: { meaning: "rolling window of the breaker's statistics" },
  emergencyFraction: { meaning: "emergency bucket size, as a fraction of the region's share" },
  emergencyMaxBuckets: { meaning: 'subjects the emergency buckets track' },
  reservationSweepMs: {
    meaning:
      'how often expired reservations are swept and refunded ([reservations.md](reservations.md)); 0: never',
  },
  warmUpRounds: {
    meaning:
      'before the agent says ready, batches of 64 dry-run decisions of its policies through the decision path; 0: none',
  },
  drainDelayMs: { meaning: 'after SIGTERM, time `/readyz` says 503 before the listener closes' },
  shutdownTimeoutMs: { meaning: 'longest wait for in-flight requests before exiting anyway' },
};
