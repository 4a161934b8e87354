/**
 * The kind registry: every policy kind's traits (core/kinds/kind.ts), looked up by name. Code that asks what a
 * kind can do (borrow, shard, give grants, take reservations, …) reads it here instead of naming kinds.
 */
import { concurrencyKind } from './concurrency.js';
import { dailyKind } from './daily.js';
import { KIND_NAMES, type KindName, type KindTraits } from './kind.js';
import { slidingLogKind } from './sliding-log.js';
import { tokenBucketKind } from './token-bucket.js';

export { KIND_NAMES, type KindName, type KindTraits } from './kind.js';

/** Every kind by name: a kind name without an entry (or an entry of another name) fails to compile. */
export const KINDS = {
  token_bucket: tokenBucketKind,
  sliding_log: slidingLogKind,
  concurrency: concurrencyKind,
  daily: dailyKind,
} as const satisfies { readonly [K in KindName]: KindTraits<K> };

/** The traits of `kind`. */
export function kindOf(kind: KindName): KindTraits {
  return KINDS[kind];
}

/** The kinds, in KIND_NAMES order. */
export function allKinds(): KindTraits[] {
  return KIND_NAMES.map((k) => KINDS[k]);
}

/** The kinds whose trait `trait` is true, by name (for messages: "only for kind sliding_log"). */
export function kindsWith(trait: (k: KindTraits) => boolean): KindName[] {
  return allKinds()
    .filter(trait)
    .map((k) => k.kind);
}
