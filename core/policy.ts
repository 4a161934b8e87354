import { z } from 'zod';

/** Largest capacity and refill a policy may declare: keeps micro-token arithmetic exact in doubles (≤ 2^53). */
export const MAX_CAPACITY = 1e9;
export const MAX_REFILL_PER_SECOND = 1e9;
/** Idle TTL ceiling: 30 days. */
export const MAX_IDLE_TTL_SECONDS = 30 * 24 * 3600;

/** A policy name: lower-case letters, digits, `_`, `-`, `.`; starts with a letter or digit; at most 64 chars. */
export const PolicyName = z
  .string()
  .regex(
    /^[a-z0-9][a-z0-9_.-]{0,63}$/,
    'policy names are 1-64 chars of a-z 0-9 _ - . starting with a-z or 0-9',
  );
export type PolicyName = z.infer<typeof PolicyName>;

/** A region name such as `us`, `eu-west`: lower-case, starts with a letter, at most 32 chars. */
export const RegionName = z
  .string()
  .regex(/^[a-z][a-z0-9-]{0,31}$/, 'region names are 1-32 chars of a-z 0-9 - starting with a-z');
export type RegionName = z.infer<typeof RegionName>;

/**
 * How a policy is enforced across regions.
 * - `regional`: each region enforces its share of the global budget (default).
 * - `strict`: one bucket with the whole budget in `homeRegion`; other regions forward to it.
 * - `local`: every region enforces the whole budget alone (N× overshoot by design; cheap reads only).
 */
export const PolicyMode = z.enum(['regional', 'strict', 'local']);
export type PolicyMode = z.infer<typeof PolicyMode>;

/**
 * What a decision does when the policy's store (or home region, or coordinator) cannot answer.
 * - `closed`: deny (default).
 * - `open`: allow, counted; refused for `strict` policies, which guard high-value operations.
 * - `local`: decide from a small in-process emergency bucket.
 */
export const FailureMode = z.enum(['closed', 'open', 'local']);
export type FailureMode = z.infer<typeof FailureMode>;

const positiveFinite = (max: number, what: string) =>
  z
    .number()
    .positive(`${what} must be > 0`)
    .max(max, `${what} must be ≤ ${max}`)
    .refine(Number.isFinite, `${what} must be finite`);

/** Seconds an idle bucket needs to refill from empty: the shortest idle TTL a policy may have. */
export function secondsToFill(capacity: number, refillPerSecond: number): number {
  return capacity / refillPerSecond;
}

/** Fields an operator writes; the name comes from elsewhere (the URL path, the file key). */
const PolicyFields = z.strictObject({
  capacity: positiveFinite(MAX_CAPACITY, 'capacity'),
  refillPerSecond: positiveFinite(MAX_REFILL_PER_SECOND, 'refillPerSecond'),
  maxCost: positiveFinite(MAX_CAPACITY, 'maxCost').optional(),
  mode: PolicyMode.default('regional'),
  homeRegion: RegionName.optional(),
  onStoreFailure: FailureMode.default('closed'),
  idleTtlSeconds: z.number().int().positive().max(MAX_IDLE_TTL_SECONDS).optional(),
  version: z.number().int().positive().max(1_000_000).default(1),
  minShare: z.number().min(0).max(1).optional(),
});

type PolicyFieldsOut = z.output<typeof PolicyFields>;

function checkPolicy(p: PolicyFieldsOut, ctx: z.RefinementCtx): void {
  const maxCost = p.maxCost ?? Math.min(1, p.capacity);
  if (maxCost > p.capacity) {
    ctx.addIssue({ code: 'custom', path: ['maxCost'], message: 'maxCost must be ≤ capacity' });
  }
  if (p.idleTtlSeconds !== undefined && p.idleTtlSeconds < secondsToFill(p.capacity, p.refillPerSecond)) {
    ctx.addIssue({
      code: 'custom',
      path: ['idleTtlSeconds'],
      message: `idleTtlSeconds must be ≥ capacity / refillPerSecond = ${secondsToFill(p.capacity, p.refillPerSecond)} s, so an expired bucket is never fuller than a full one`,
    });
  }
  if (defaultIdleTtl(p.capacity, p.refillPerSecond) > MAX_IDLE_TTL_SECONDS) {
    ctx.addIssue({
      code: 'custom',
      path: ['refillPerSecond'],
      message: 'refilling from empty would take longer than 30 days',
    });
  }
  if (p.mode === 'strict' && p.homeRegion === undefined) {
    ctx.addIssue({ code: 'custom', path: ['homeRegion'], message: 'strict policies need a homeRegion' });
  }
  if (p.mode === 'strict' && p.onStoreFailure === 'open') {
    ctx.addIssue({
      code: 'custom',
      path: ['onStoreFailure'],
      message: 'strict policies guard high-value operations and may not fail open',
    });
  }
  if (p.minShare !== undefined && p.minShare > 0 && p.minShare * p.capacity < maxCost) {
    ctx.addIssue({
      code: 'custom',
      path: ['minShare'],
      message: `minShare × capacity must be ≥ maxCost (${maxCost}) so a region holding a share can admit the largest cost`,
    });
  }
}

/** Idle TTL used when a policy does not set one: time to refill from empty, rounded up, at least 60 s. */
export function defaultIdleTtl(capacity: number, refillPerSecond: number): number {
  return Math.max(60, Math.ceil(secondsToFill(capacity, refillPerSecond)));
}

function fillDefaults<T extends PolicyFieldsOut>(p: T): T & { maxCost: number; idleTtlSeconds: number } {
  return {
    ...p,
    maxCost: p.maxCost ?? Math.min(1, p.capacity),
    idleTtlSeconds: p.idleTtlSeconds ?? defaultIdleTtl(p.capacity, p.refillPerSecond),
  };
}

/** The body an operator sends to create or replace a policy (name excluded); defaults fill the rest. */
export const PolicySpec = PolicyFields.superRefine(checkPolicy).transform(fillDefaults);
export type PolicySpecInput = z.input<typeof PolicySpec>;

/** A stored policy: every field filled. */
export const Policy = PolicyFields.extend({ name: PolicyName })
  .superRefine(checkPolicy)
  .transform(fillDefaults);
/** A validated policy with every default filled. */
export type Policy = z.output<typeof Policy>;
export type PolicyInput = z.input<typeof Policy>;

/** Parse a policy, throwing a ZodError listing every problem. */
export function parsePolicy(input: unknown): Policy {
  return Policy.parse(input);
}
