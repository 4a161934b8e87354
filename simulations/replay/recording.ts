/**
 * What one strategy's replay against the stack recorded: every answer with its wall times, the shares the
 * coordinator issued over time, Redis key counts and the control-plane counters. Wall times are milliseconds
 * after the replay's start (the instant scenario time 0 was sent); scenario time is wall time × K.
 */
import type { Arrival } from './arrivals.js';

/** The stack's answer to one arrival. */
export interface RealAnswer {
  /** When the request went out (its scheduled instant, or later when the sender was late), wall ms. */
  sentMs: number;
  /** When the answer (or the failure) came back, wall ms. */
  answeredMs: number;
  /** HTTP status; 0 when no answer came (connection refused, reset, timed out). */
  status: number;
  /** The decision; false when there was none. */
  allowed: boolean;
  /** ms until the cost could fit (0 when allowed); null when it never can or there was no decision. */
  retryAfterMs: number | null;
  /** The agent's `reason` for a degraded decision (`store_unavailable`, `home_unreachable`, …). */
  reason?: string | undefined;
  /** Why there was no decision (a transport error, a problem document's code). */
  error?: string | undefined;
}

/** Issued shares of the policy by region (GET /v1/allocations), at a wall instant. */
export interface ShareSample {
  atMs: number;
  shares: number[];
}

/** Control messages during the replay, from the coordinator's /metrics (differences over the replay). */
/**
 * The agents' counters over a replay, summed over regions: where a real row's delivery went when it falls short of
 * the prediction (a loan late or lost on a link, a grant the borrower could not believe, Redis too slow).
 */
export interface AgentCounts {
  /** Loan requests by how the lender answered (`quotaplane_loan_requests_total{answer}`). */
  loanAnswers: Record<string, number>;
  /** Grants believed less than given (`quotaplane_loan_grants_distrusted_total`): tokens left the lender's bucket and reached none. */
  grantsDistrusted: number;
  /** Redis calls that missed the store timeout (`quotaplane_store_latency_seconds_count{outcome="timeout"}`). */
  storeTimeouts: number;
}

export interface ControlCounts {
  /** `quotaplane_protocol_messages_total` by kind: messages the coordinator received. */
  heartbeat: number;
  usage: number;
  ack: number;
  bye: number;
  /** One renewal (or refusal) answers each heartbeat. */
  renewals: number;
  /** `quotaplane_allocation_writes_total`: record writes to JetStream KV (each a put and its confirmation). */
  recordWrites: number;
  /** Each write reaches every agent's watch. */
  recordDeliveries: number;
  /** `quotaplane_protocol_messages_dropped_total`. */
  dropped: number;
  /**
   * Loan traffic between agents, from their /metrics: requests sent (`quotaplane_loan_requests_total`) plus the
   * answers lenders sent back (`quotaplane_loans_served_total`). The coordinator never sees these.
   */
  loans: number;
  /**
   * received + renewals + 2 × recordWrites + recordDeliveries + loans: the simulator's count of the same messages.
   */
  total: number;
  /** Wall seconds between the two /metrics reads. */
  windowSeconds: number;
}

export interface Recording {
  /** The policy's name on the stack. */
  policy: string;
  arrivals: readonly Arrival[];
  /** By arrival index (= id). */
  answers: readonly RealAnswer[];
  shares: readonly ShareSample[];
  /** Most keys each region's Redis held at any sample (DBSIZE), by region name. */
  peakKeys: Record<string, number>;
  control: ControlCounts | undefined;
  /** What the agents' own counters say of loans and of their Redis over the replay (undefined if the stack died). */
  agents: AgentCounts | undefined;
  /** Strict decisions the agents forwarded to the home region (`quotaplane_forwarded_decisions_total`). */
  forwarded: number;
  /** Wall seconds from the start to the last answer. */
  wallSeconds: number;
  /** How late each request went out against its compressed arrival time, wall ms, ascending. */
  sendLagMs: Float64Array;
  /** Faults injected, with their wall time. */
  faults: { kind: string; atMs: number }[];
}
