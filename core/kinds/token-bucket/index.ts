/**
 * The `token_bucket` kind as registered (core/kinds/index.ts): its traits, its schema fragment, its model
 * (core/models/token-bucket.ts, the model of lua/token_bucket.lua; refund, lend, credit, grant and subject
 * creation have theirs beside it) and its share sizing (core/shares/share-sizing.ts).
 */
import { BucketModel } from '../../models/token-bucket.js';
import { sizedBucket } from '../../shares/share-sizing.js';
import type { Kind } from '../kind.js';
import { tokenBucketSchema } from './schema.js';
import { tokenBucketTraits } from './traits.js';

export { MAX_NEW_SUBJECTS_PER_MINUTE, MAX_SHARDS, NewSubjects } from './schema.js';
export { BucketModel, sizedBucket };

export const tokenBucketKind = {
  ...tokenBucketTraits,
  schema: tokenBucketSchema,
  model: BucketModel,
  sizing: sizedBucket,
} as const satisfies Kind<'token_bucket'>;
