/**
 * `@quotaplane/client`: the regional agent's client for services. The Fastify plugin is `@quotaplane/client/fastify`.
 */
export {
  AGENT_FAILURES,
  AgentClient,
  AgentRequestError,
  AgentUnavailableError,
  ClientShedError,
  DEGRADED,
  type AgentClientOptions,
  type AgentFailure,
  type BreakerOptions,
  type BreakerState,
  type ClientCheckResult,
  type ClientStats,
  type CoalesceOptions,
  type Decision,
  type DecideOptions,
  type Degraded,
  type FailureMode,
  type PolicyFailureOptions,
} from './agent-client.js';
export type { FallbackBucket } from './fallback.js';
export type { GrantDecision, GrantOptions, GrantStats } from './grants.js';
export {
  DIRECT_MISSES,
  type DirectDecision,
  type DirectMiss,
  type DirectOptions,
  type DirectRedis,
  type DirectStats,
} from './direct.js';
export {
  DecisionCheck,
  DecisionRequest,
  DecisionResponse,
  LeaseReleaseResponse,
  LIMITER_UNAVAILABLE,
  Problem,
  RATE_LIMITED,
  type DecisionReason,
  type WireCheckResult,
} from '../../../core/wire/agent.js';
export {
  BatchAnswer,
  BatchRequest,
  BatchResponse,
  MAX_DECISIONS_PER_BATCH,
} from '../../../core/wire/batch.js';
export {
  CommitRequest,
  ReservationRequest,
  ReservationResponse,
  SettlementResponse,
} from '../../../core/models/reservation.js';
