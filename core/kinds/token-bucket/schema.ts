/**
 * The `token_bucket` kind's fragment of the policy schema (core/kinds/kind.ts `KindSchema`): its own fields,
 * `shards` and `newSubjects`, and their rules. core/policy/policy.ts composes it with the fields every kind has.
 */
import { z } from 'zod';
import type { KindLookup, KindSchema, PolicyDraft } from '../kind.js';

/** Most sub-buckets a sharded policy may have. */
export const MAX_SHARDS = 64;

/** Largest subject-creation cap: new buckets one policy may create per minute per region. */
export const MAX_NEW_SUBJECTS_PER_MINUTE = 100_000;

/**
 * The subject-creation cap of a token-bucket policy (`newSubjects`): at most `perMinute` new subject buckets in
 * any rolling minute, per region. A decision for an unseen subject beyond it gets the `flood` answer: `deny`
 * (refused, `reason: "subject_flood"`) or `shared` (decided against one shared per-policy bucket).
 */
export const NewSubjects = z.strictObject({
  perMinute: z
    .number()
    .int('newSubjects.perMinute must be a whole number')
    .min(1, 'newSubjects.perMinute must be ≥ 1')
    .max(MAX_NEW_SUBJECTS_PER_MINUTE, `newSubjects.perMinute must be ≤ ${MAX_NEW_SUBJECTS_PER_MINUTE}`),
  flood: z.enum(['deny', 'shared']).default('deny'),
});
export type NewSubjects = z.output<typeof NewSubjects>;

const fields = {
  /**
   * A hot key split into this many sub-buckets on different cluster slots (token buckets only): each holds
   * capacity / shards and refills at refillPerSecond / shards, and a check lands on one of them at random.
   */
  shards: z.number().int().min(2).max(MAX_SHARDS).optional(),
  /**
   * Subject-creation cap (token buckets only): at most `perMinute` new subject buckets per rolling minute in each
   * region; an unseen subject beyond it gets the `flood` answer. Subjects named in `subjects` are exempt.
   */
  newSubjects: NewSubjects.optional(),
};

type Draft = PolicyDraft & z.output<z.ZodObject<typeof fields>>;

/** Rules of `shards`: token buckets only, and every sub-bucket (of the policy and of each class) fits maxCost. */
function checkShards(p: Draft, ctx: z.RefinementCtx, kinds: KindLookup): void {
  const k = p.shards;
  if (k === undefined) return;
  const issue = (path: (string | number)[], message: string) =>
    ctx.addIssue({ code: 'custom', path, message });
  if (!kinds.kindOf(p.kind).shards) issue(['shards'], 'shards are for token buckets only');
  const maxCost = p.maxCost ?? Math.min(1, p.capacity);
  if (p.capacity / k < maxCost) {
    issue(
      ['shards'],
      `each of ${k} shards holds capacity / ${k} = ${p.capacity / k}, below maxCost ${maxCost}`,
    );
  }
  for (const [name, c] of Object.entries(p.classes ?? {})) {
    const classMax = c.maxCost ?? Math.min(1, c.capacity);
    if (c.capacity / k < classMax) {
      issue(
        ['classes', name, 'capacity'],
        `each of ${k} shards of class ${name} holds ${c.capacity / k}, below its maxCost ${classMax}`,
      );
    }
  }
  if (p.minShare !== undefined && p.minShare > 0 && (p.minShare * p.capacity) / k < maxCost) {
    issue(
      ['minShare'],
      `minShare × capacity / shards must be ≥ maxCost (${maxCost}) so every shard can admit it`,
    );
  }
}

/** Rules of `newSubjects`: token buckets only, and not with shards (a sharded key is one hot subject). */
function checkNewSubjects(p: Draft, ctx: z.RefinementCtx, kinds: KindLookup): void {
  if (p.newSubjects === undefined) return;
  const issue = (message: string) => ctx.addIssue({ code: 'custom', path: ['newSubjects'], message });
  if (!kinds.kindOf(p.kind).newSubjects) issue('newSubjects is for token buckets only');
  if (p.shards !== undefined) {
    issue('newSubjects and shards do not mix: a sharded policy guards a few hot keys, not many subjects');
  }
}

export const tokenBucketSchema = {
  fields,
  rules(p: Draft, ctx: z.RefinementCtx, kinds: KindLookup): void {
    checkShards(p, ctx, kinds);
    checkNewSubjects(p, ctx, kinds);
  },
} as const satisfies KindSchema;
