/**
 * The kind registry: every policy kind (core/kinds/kind.ts `Kind`: its traits, schema fragment, model and share
 * sizing, each from its folder core/kinds/<kind>/), looked up by name. Code that asks what a kind can do
 * (borrow, shard, give grants, take reservations, …) reads it here instead of naming kinds, and
 * core/policy/policy.ts composes the policy schema from the kinds' fragments, in this order.
 */
import { concurrencyKind } from './concurrency/index.js';
import { dailyKind } from './daily/index.js';
import { KIND_NAMES, type Kind, type KindName, type KindTraits } from './kind.js';
import { slidingLogKind } from './sliding-log/index.js';
import { tokenBucketKind } from './token-bucket/index.js';

export { KIND_NAMES, type Kind, type KindName, type KindTraits } from './kind.js';

/**
 * Every kind by name, one line each: a kind name without an entry, an entry of another name, or a kind missing a
 * trait, its schema fragment, model or sizing fails to compile.
 */
export const KINDS = {
  token_bucket: tokenBucketKind,
  sliding_log: slidingLogKind,
  concurrency: concurrencyKind,
  daily: dailyKind,
} as const satisfies { readonly [K in KindName]: Kind<K> };

/** The kind `kind`: its traits, schema fragment, model and sizing. */
export function kindOf(kind: KindName): Kind {
  return KINDS[kind];
}

/** The kinds, in KIND_NAMES order. */
export function allKinds(): Kind[] {
  return KIND_NAMES.map((k) => KINDS[k]);
}

/** The kinds whose trait `trait` is true, by name (for messages: "only for kind sliding_log"). */
export function kindsWith(trait: (k: KindTraits) => boolean): KindName[] {
  return allKinds()
    .filter(trait)
    .map((k) => k.kind);
}
