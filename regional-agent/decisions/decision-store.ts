import type { DecideRequest, Decision } from '../../core/bucket-wire.js';
import type { RefundRequest } from '../../core/refund.js';

/** How a whole-request idempotency claim went. */
export type ClaimOutcome = 'new' | 'same' | 'conflict';

/** What a refund gave back, in tokens, per bucket; `tokens` is null when the bucket was gone. */
export interface RefundOutcome {
  results: { refunded: number; tokens: number | null }[];
  recordDeleted: boolean;
}

/**
 * Everything the decision path asks of its bucket store: Redis (or a Redis Cluster) in the agent, an in-memory
 * model in unit tests. Methods throw only when something broke; a denial is a value.
 */
export interface DecisionStore {
  /** Decide one slot's checks all-or-nothing (`lua/token_bucket.lua`). */
  decide(request: DecideRequest): Promise<Decision>;
  /** The cluster slot of a key (0 for every key on a single Redis): checks are grouped by it. */
  slotOf(key: string): number;
  /** Give back what a decision charged (`lua/refund.lua`), deleting its idempotency record when named. */
  refund(request: RefundRequest): Promise<RefundOutcome>;
  /**
   * Claim an idempotency key for a whole request that spans several slots: `new` the first time, `same` when
   * the key already answers this request (same fingerprint), `conflict` when it answers another. With
   * `peekOnly` nothing is written (dry runs).
   */
  claim(key: string, fingerprint: string, ttlMs: number, peekOnly: boolean): Promise<ClaimOutcome>;
}
