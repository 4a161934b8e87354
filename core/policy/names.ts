/**
 * The small schemas every layer reads by name: policy and region names, how a policy is enforced across regions, what it does when it
 * cannot decide, and what a subject class may be called. Kept apart from the policy schema (core/policy/policy.ts,
 * which re-exports them and composes every kind's models), so the wire contracts and the client package load
 * these without every kind's model.
 */
import { z } from 'zod';

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

/** A subject class (a plan, a tier): lower-case letters, digits, `_`, `-`; starts with a letter; at most 32 chars. */
export const ClassName = z
  .string()
  .regex(/^[a-z][a-z0-9_-]{0,31}$/, 'class names are 1-32 chars of a-z 0-9 _ - starting with a-z');
export type ClassName = z.infer<typeof ClassName>;
