/**
 * How a region's share of a policy becomes the bucket it enforces: the policy's burst and refill times the share,
 * and the share's rate-history floor (core/shares/shares.ts) turned into the script's floor, so buckets last written
 * before the floor instant refill at the lowest share in force since, and missing buckets start at the lowest
 * share held within the idle TTL. The one rule the agent's decisions and every simulated strategy size their
 * buckets by.
 */
import type { BucketCheck } from '../wire/bucket.js';
import type { SizedPolicyFields } from '../kinds/kind.js';
import type { Policy } from '../policy/policy.js';
import type { RegionalShare } from './shares.js';

/** What sizing reads of a policy (core/kinds/kind.ts `SizedPolicyFields`, which the kind registry types sizing by). */
export type SizedPolicy = Pick<SizedPolicyFields, 'capacity' | 'refillPerSecond' | 'idleTtlSeconds'>;

/** What a share of a policy's budget gives a region: its burst and refill, in tokens and tokens per second. */
export function shareOfBudget(
  budget: Pick<Policy, 'capacity' | 'refillPerSecond'>,
  share: number,
): { capacity: number; refillPerSecond: number } {
  return { capacity: budget.capacity * share, refillPerSecond: budget.refillPerSecond * share };
}

/** Epoch ms (the agent's clock) to the store's time in µs (Redis TIME): the agent's conversion. */
export const epochMsToStoreMicros = (ms: number): number => Math.max(0, Math.round(ms * 1000));

/**
 * The bucket check for `cost` tokens of the bucket at `key` under `share` (a bare number is a share without a
 * floor; a share above 1 is an overcommit only the simulator's `independent` and `static` strategies ask for).
 * `toStoreMicros` converts the floor's instant (ms of the share's clock) to the store's µs.
 */
export function sizedBucket(
  policy: SizedPolicy,
  key: string,
  cost: number,
  share: RegionalShare | number,
  toStoreMicros: (ms: number) => number = epochMsToStoreMicros,
): BucketCheck {
  const bucket: BucketCheck = {
    key,
    ...shareOfBudget(policy, typeof share === 'number' ? share : share.share),
    cost,
    ttlMs: policy.idleTtlSeconds * 1000,
  };
  if (typeof share === 'number') return bucket;
  const { floor, lowest } = share;
  // A bucket missing now counts as written at time 0, before any floor instant, and starts at the floor's
  // capacity: the lowest share held within the idle TTL (rises included). Without it a region whose share rose
  // would start new buckets full at the new share while the region that gave the share up had already spent its
  // tokens: a move minted up to C × the amount moved (seed 31 of the property suite, issue 25). With no decrease
  // to floor existing buckets by, the instant is 1 µs: no bucket was written before it.
  const low = Math.min(floor?.share ?? share.share, lowest ?? share.share);
  if (low < share.share) {
    const beforeMicros = floor === undefined ? 1 : Math.max(1, toStoreMicros(floor.sinceMs));
    bucket.floor = { beforeMicros, ...shareOfBudget(policy, low) };
  }
  return bucket;
}
