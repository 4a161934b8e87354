/**
 * The policy schema: the fields every kind has and their rules, composed with each kind's fragment (its own
 * fields and their rules, core/kinds/<kind>/schema.ts) from the kind registry (core/kinds/index.ts). The rules
 * of the traits (a declared or derived rate, a window, whole units, strict mode, an emergency bucket, classes)
 * are here, read from the registry; the rules of one kind's own fields are in its fragment.
 */
import { z } from 'zod';
import { roundDerivedRate } from '../admin-numbers.js';
import { IPV4_PREFIX_BOUNDS, IPV6_PREFIX_BOUNDS, ipPrefixesOf, ipSubject } from '../subjects/ip-subject.js';
import { allKinds, KIND_NAMES, kindOf, kindsWith, type KindName, type KINDS } from '../kinds/index.js';
import type { KindLookup } from '../kinds/kind.js';
import { hasOwnKey, ownRecord, ownValue, setOwn } from '../own-keys.js';
import {
  MAX_CAPACITY,
  MAX_IDLE_TTL_SECONDS,
  MAX_LOG_LIMIT,
  MAX_REFILL_PER_SECOND,
  positiveFinite,
  SECONDS_PER_DAY,
} from './limits.js';

export {
  MAX_CAPACITY,
  MAX_IDLE_TTL_SECONDS,
  MAX_LOG_LIMIT,
  MAX_REFILL_PER_SECOND,
  MIN_WRITTEN_CAPACITY,
  MIN_WRITTEN_REFILL_PER_SECOND,
  SECONDS_PER_DAY,
} from './limits.js';
import { ClassName, FailureMode, PolicyMode, PolicyName, RegionName } from './names.js';
export { ClassName, FailureMode, PolicyMode, PolicyName, RegionName } from './names.js';

/**
 * What a policy limits, and how.
 * - `token_bucket` (default): a burst of `capacity` tokens refilled at `refillPerSecond`.
 * - `sliding_log`: at most `capacity` events in any rolling `windowSeconds` (an exact window: one sorted-set
 *   entry per admitted unit of cost, so a subject's memory is bounded by `capacity` entries). Its long-run rate,
 *   `capacity / windowSeconds`, is what shares and demand are computed on; `refillPerSecond` is derived from it.
 */
export const PolicyKind = z.enum(KIND_NAMES);
export type PolicyKind = z.infer<typeof PolicyKind>;

/**
 * Kinds decided by `lua/sliding_log.lua`: one sorted-set entry per admitted unit. A `concurrency` policy is a log
 * whose window is the lease TTL (`leaseSeconds`): an acquired slot counts until it is released (its entry
 * removed by `lua/sliding_log_refund.lua`) or its lease runs out, so a crashed holder's slot comes back.
 */
export function isLogKind(kind: PolicyKind): boolean {
  return kindOf(kind).decidedBy === 'log';
}

/**
 * What a policy's subjects are. Absent: any text the caller chooses (a tenant, a user id). `ip`: a client's
 * address, bucketed by its network prefix (`ipv4Prefix`, `ipv6Prefix`; core/subjects/ip-subject.ts): every address of one
 * prefix is one subject, whichever form the caller sent it in.
 */
export const SubjectKind = z.enum(['ip']);
export type SubjectKind = z.infer<typeof SubjectKind>;

const prefixLength = (field: string, bounds: { min: number; max: number }) =>
  z
    .number()
    .int(`${field} must be a whole number of bits`)
    .min(bounds.min, `${field} must be ≥ ${bounds.min}`)
    .max(bounds.max, `${field} must be ≤ ${bounds.max}`);

/** Most classes one policy may define, and most subjects it may name (each naming its class). */
export const MAX_CLASSES = 32;
export const MAX_NAMED_SUBJECTS = 10_000;

/** Seconds an idle bucket needs to refill from empty: the shortest idle TTL a policy may have. */
export function secondsToFill(capacity: number, refillPerSecond: number): number {
  return capacity / refillPerSecond;
}

/**
 * A class's own limits: its capacity, its refill (token buckets; derived from the window for the log kinds) and
 * its largest cost (default `min(1, capacity)`). Every other field is the policy's.
 */
const ClassLimits = z.strictObject({
  capacity: positiveFinite(MAX_CAPACITY, 'capacity'),
  refillPerSecond: positiveFinite(MAX_REFILL_PER_SECOND, 'refillPerSecond').optional(),
  maxCost: positiveFinite(MAX_CAPACITY, 'maxCost').optional(),
});

/** Turns a union of field shapes into one shape holding them all. */
type AllOf<U> = (U extends unknown ? (u: U) => void : never) extends (all: infer I) => void ? I : never;
/** The fields only some kind has, every kind's (core/kinds/<kind>/schema.ts `fields`). */
type KindFields = AllOf<(typeof KINDS)[KindName]['schema']['fields']>;

/** The fields every kind has, before and after those of the kinds (the order problems are listed in). */
const SHARED_FIELDS = {
  kind: PolicyKind.default('token_bucket'),
  capacity: positiveFinite(MAX_CAPACITY, 'capacity'),
  /** Required for token buckets; derived (capacity / its window, or / one day) for the other kinds. */
  refillPerSecond: positiveFinite(MAX_REFILL_PER_SECOND, 'refillPerSecond').optional(),
};
const SHARED_FIELDS_AFTER = {
  maxCost: positiveFinite(MAX_CAPACITY, 'maxCost').optional(),
  mode: PolicyMode.default('regional'),
  homeRegion: RegionName.optional(),
  onStoreFailure: FailureMode.default('closed'),
  idleTtlSeconds: z.number().int().positive().max(MAX_IDLE_TTL_SECONDS).optional(),
  version: z.number().int().positive().max(1_000_000).default(1),
  minShare: z.number().min(0).max(1).optional(),
  /**
   * Subject classes with limits of their own ("enterprise tenants get 10×"): a check names its class, or the
   * policy names the subject's in `subjects`; any other subject has the policy's own limits.
   */
  classes: ownRecord(ClassName, ClassLimits)
    .refine((c) => Object.keys(c).length <= MAX_CLASSES, `at most ${MAX_CLASSES} classes`)
    .optional(),
  /** `ip`: subjects are client addresses, bucketed by prefix; absent: any text. */
  subjectKind: SubjectKind.optional(),
  /** Bits of an IPv4 address one subject of an `ip` policy covers (default 32: the address). */
  ipv4Prefix: prefixLength('ipv4Prefix', IPV4_PREFIX_BOUNDS).optional(),
  /** Bits of an IPv6 address one subject of an `ip` policy covers (default 64: one customer's network). */
  ipv6Prefix: prefixLength('ipv6Prefix', IPV6_PREFIX_BOUNDS).optional(),
  /** Named subjects (as callers send them, before any hashing) and their class. */
  subjects: ownRecord(z.string().min(1).max(1024), ClassName)
    .refine(
      (m) => Object.keys(m).length <= MAX_NAMED_SUBJECTS,
      `at most ${MAX_NAMED_SUBJECTS} named subjects`,
    )
    .optional(),
};

/**
 * The kinds' own fields, in registry order. A field two kinds declare, or one every kind has, is a mistake in a
 * kind's fragment: refused here, when the schema is built, so no policy is ever parsed by an ambiguous schema.
 */
function kindFields(): KindFields {
  const fields: Record<string, unknown> = {};
  for (const k of allKinds()) {
    for (const [name, schema] of Object.entries(k.schema.fields)) {
      const shared =
        hasOwnKey(SHARED_FIELDS, name) || hasOwnKey(SHARED_FIELDS_AFTER, name) || name === 'name';
      if (shared || hasOwnKey(fields, name))
        throw new Error(`kind ${k.kind} declares the policy field ${name}, which is already one`);
      setOwn(fields, name, schema);
    }
  }
  return fields as KindFields;
}

/** Fields an operator writes; the name comes from elsewhere (the URL path, the file key). */
const PolicyFields = z.strictObject({ ...SHARED_FIELDS, ...kindFields(), ...SHARED_FIELDS_AFTER });

type PolicyFieldsOut = z.output<typeof PolicyFields>;

/** The window of a log kind: a sliding log's `windowSeconds`, a concurrency policy's `leaseSeconds`. */
export function logWindowSeconds(p: Pick<PolicyFieldsOut, 'kind' | 'windowSeconds' | 'leaseSeconds'>) {
  return kindOf(p.kind).window === 'leaseSeconds' ? p.leaseSeconds : p.windowSeconds;
}

/**
 * A policy's window in whole seconds, for `RateLimit-Policy`'s `w` (time to refill from empty): a log kind's own
 * window field, a daily budget's day, a token bucket's `capacity / refillPerSecond` rounded up. Computed from a
 * derived rate it was `capacity / (capacity / window)`, one ulp above the window for many capacities (11 / (11 /
 * 60) is 60.00000000000001), which rounded up to one second more: w=61, w=86401.
 */
export function windowSecondsOf(
  p: Pick<Policy, 'kind' | 'capacity' | 'refillPerSecond' | 'windowSeconds' | 'leaseSeconds'>,
): number {
  const rate = kindOf(p.kind).rate;
  const window = rate === 'day' ? SECONDS_PER_DAY : rate === 'window' ? logWindowSeconds(p) : undefined;
  return window ?? Math.ceil(p.capacity / p.refillPerSecond);
}

/**
 * The refill a policy runs at: its own for a token bucket, capacity / window for a sliding log, capacity /
 * lease for a concurrency policy (the most slots per second it can hand out if every holder keeps its lease).
 */
function refillOf(p: PolicyFieldsOut): number | undefined {
  return derivedRate(p, p.capacity) ?? (kindOf(p.kind).rate === 'declared' ? p.refillPerSecond : undefined);
}

/**
 * The rate a kind derives from `capacity` (capacity / its window, or / one day); undefined for a kind whose rate
 * is declared, or a log kind without its window.
 */
function derivedRate(
  p: Pick<PolicyFieldsOut, 'kind' | 'windowSeconds' | 'leaseSeconds'>,
  capacity: number,
): number | undefined {
  const { rate } = kindOf(p.kind);
  if (rate === 'day') return capacity / SECONDS_PER_DAY;
  if (rate === 'declared') return undefined;
  const window = logWindowSeconds(p);
  return window === undefined ? undefined : capacity / window;
}

/**
 * Rules of `subjectKind`: the prefixes belong to `ip` policies, and a named subject of one (`subjects`) is written
 * as its canonical prefix, the only text a decision's subject is looked up by.
 */
function checkSubjectKind(p: PolicyFieldsOut, ctx: z.RefinementCtx): void {
  const issue = (path: string[], message: string) => ctx.addIssue({ code: 'custom', path, message });
  if (p.subjectKind !== 'ip') {
    for (const field of ['ipv4Prefix', 'ipv6Prefix'] as const) {
      if (p[field] !== undefined) issue([field], `${field} is only for subjectKind ip`);
    }
    return;
  }
  const prefixes = ipPrefixesOf(p);
  for (const subject of Object.keys(p.subjects ?? {})) {
    const named = ipSubject(subject, prefixes);
    if (!named.ok) issue(['subjects', subject], named.reason);
    else if (named.subject !== subject) {
      issue(['subjects', subject], `an ip policy names a subject by its prefix: write ${named.subject}`);
    }
  }
}

/** The fields kinds hold their window in (`KindTraits.window`), in registry order. */
const WINDOW_FIELDS = [...new Set(allKinds().flatMap((k) => (k.window === undefined ? [] : [k.window])))];

/** What a kind's rules may ask of the registry. */
const KIND_LOOKUP: KindLookup = { kindOf, kindsWith };

/**
 * Rules of a policy's rate, read from its kind's traits (messages name the kind by its traits too): a window
 * field only for the kinds that hold their window in it; a declared rate present; a rate derived from a window
 * with its window, and not written otherwise; whole units for a kind that counts them (`wholeUnits`; at most
 * MAX_LOG_LIMIT for the log store group); no emergency bucket or strict mode for a kind without them. False when
 * the policy cannot be checked further.
 */
function checkRate(p: PolicyFieldsOut, ctx: z.RefinementCtx): boolean {
  const issue = (path: string, message: string) => ctx.addIssue({ code: 'custom', path: [path], message });
  const traits = kindOf(p.kind);
  for (const field of WINDOW_FIELDS) {
    if (traits.window !== field && p[field] !== undefined) {
      issue(field, `${field} is only for kind ${kindsWith((k) => k.window === field).join(', ')}`);
    }
  }
  if (traits.rate === 'declared' && p.refillPerSecond === undefined) {
    issue('refillPerSecond', `${p.kind.replaceAll('_', '-')} policies need refillPerSecond`);
    return false;
  }
  const field = traits.window ?? 'windowSeconds';
  const window = traits.rate === 'window' ? logWindowSeconds(p) : undefined;
  if (traits.rate === 'window' && window === undefined) {
    issue(field, `${p.kind} policies need ${field}`);
    return false;
  }
  if (traits.wholeUnits) {
    // The log store keeps one entry per unit: at most MAX_LOG_LIMIT of them.
    const most = traits.decidedBy === 'log' ? ` ≤ ${MAX_LOG_LIMIT}` : '';
    const what = `${traits.called} counts whole ${traits.units}`;
    if (!Number.isInteger(p.capacity) || (traits.decidedBy === 'log' && p.capacity > MAX_LOG_LIMIT)) {
      issue('capacity', `${what}: capacity must be an integer${most}`);
    }
    if (p.maxCost !== undefined && !Number.isInteger(p.maxCost)) {
      issue('maxCost', `${what}: maxCost must be an integer`);
    }
  }
  if (window !== undefined) {
    const derived = p.capacity / window;
    if (p.refillPerSecond !== undefined && !isDerivedRate(p.refillPerSecond, derived)) {
      issue(
        'refillPerSecond',
        `a ${p.kind} policy's rate is capacity / ${field} = ${roundDerivedRate(derived)}; omit refillPerSecond`,
      );
    }
  }
  if (p.onStoreFailure === 'local' && !traits.emergencyBucket) {
    issue('onStoreFailure', `an emergency token bucket is not ${traits.noun}: use closed or open`);
  }
  if (!traits.strictMode && p.mode === 'strict') {
    // A lease is released where it was acquired; a forwarded acquire would leave its release nowhere to go.
    const why = traits.leases ? ': a lease is released in the region that holds it' : '';
    issue('mode', `${p.kind} policies are regional or local${why}`);
  }
  // idleTtlSeconds ≥ capacity / rate = the window is the general rule below: no entry of a window is dropped.
  // A daily kind's rate and idle TTL are its fragment's rules (core/kinds/daily/schema.ts).
  return true;
}

/**
 * True when `written` is the `derived` rate: exact (to a billionth), or as admin answers show it (roundDerivedRate),
 * which is what a client that read a policy back may send again.
 */
export function isDerivedRate(written: number, derived: number): boolean {
  return Math.abs(written - derived) <= derived * 1e-9 || written === roundDerivedRate(derived);
}

/** The limits of each class, filled as the policy's own are (the window's rate for log kinds; maxCost ≤ 1 by default). */
function classLimitsOf(
  p: PolicyFieldsOut,
  limits: z.output<typeof ClassLimits>,
): { capacity: number; refillPerSecond: number | undefined; maxCost: number } {
  return {
    capacity: limits.capacity,
    refillPerSecond:
      kindOf(p.kind).rate === 'declared' ? limits.refillPerSecond : derivedRate(p, limits.capacity),
    maxCost: limits.maxCost ?? Math.min(1, limits.capacity),
  };
}

/** Rules of `classes` and `subjects`: each class holds to what the policy's own limits hold to. */
function checkClasses(p: PolicyFieldsOut, ctx: z.RefinementCtx): void {
  const issue = (path: (string | number)[], message: string) =>
    ctx.addIssue({ code: 'custom', path, message });
  for (const [name, raw] of Object.entries(p.classes ?? {})) {
    const at = (field: string) => ['classes', name, field];
    const c = classLimitsOf(p, raw);
    const { rate, wholeUnits } = kindOf(p.kind);
    // A derived rate may be sent back as it was derived or as answers show it (checkRate's rule for the policy's).
    if (
      rate !== 'declared' &&
      raw.refillPerSecond !== undefined &&
      (c.refillPerSecond === undefined || !isDerivedRate(raw.refillPerSecond, c.refillPerSecond))
    ) {
      const shown = c.refillPerSecond === undefined ? '' : ` (${roundDerivedRate(c.refillPerSecond)})`;
      issue(at('refillPerSecond'), `a ${p.kind} class's rate is derived from its capacity${shown}: omit it`);
    }
    if (wholeUnits) {
      if (!Number.isInteger(c.capacity) || c.capacity > MAX_LOG_LIMIT)
        issue(at('capacity'), `capacity must be an integer ≤ ${MAX_LOG_LIMIT} for ${p.kind}`);
      if (!Number.isInteger(c.maxCost)) issue(at('maxCost'), `maxCost must be an integer for ${p.kind}`);
    } else if (c.refillPerSecond === undefined && rate === 'declared') {
      issue(at('refillPerSecond'), 'token-bucket classes need refillPerSecond');
    }
    if (c.maxCost > c.capacity) issue(at('maxCost'), 'maxCost must be ≤ capacity');
    const refill = c.refillPerSecond ?? 1;
    if (p.idleTtlSeconds !== undefined && p.idleTtlSeconds < secondsToFill(c.capacity, refill)) {
      issue(
        ['idleTtlSeconds'],
        `idleTtlSeconds must be ≥ ${secondsToFill(c.capacity, refill)} s, the time class ${name} takes to refill from empty`,
      );
    }
    if (defaultIdleTtl(c.capacity, refill) > MAX_IDLE_TTL_SECONDS) {
      issue(at('refillPerSecond'), 'refilling from empty would take longer than 30 days');
    }
    if (p.minShare !== undefined && p.minShare > 0 && p.minShare * c.capacity < c.maxCost) {
      issue(['minShare'], `minShare × capacity of class ${name} must be ≥ its maxCost (${c.maxCost})`);
    }
  }
  for (const [subject, cls] of Object.entries(p.subjects ?? {})) {
    if (!hasOwnKey(p.classes, cls))
      issue(['subjects', subject], `class ${cls} is not one of the policy's classes`);
  }
}

function checkPolicy(p: PolicyFieldsOut, ctx: z.RefinementCtx): void {
  if (!checkRate(p, ctx)) return;
  // Each kind's rules of its own fields, in registry order.
  for (const k of allKinds()) k.schema.rules?.(p, ctx, KIND_LOOKUP);
  checkSubjectKind(p, ctx);
  checkClasses(p, ctx);
  const refillPerSecond = refillOf(p) ?? 1;
  const maxCost = p.maxCost ?? Math.min(1, p.capacity);
  if (maxCost > p.capacity) {
    ctx.addIssue({ code: 'custom', path: ['maxCost'], message: 'maxCost must be ≤ capacity' });
  }
  if (p.idleTtlSeconds !== undefined && p.idleTtlSeconds < secondsToFill(p.capacity, refillPerSecond)) {
    ctx.addIssue({
      code: 'custom',
      path: ['idleTtlSeconds'],
      message: `idleTtlSeconds must be ≥ capacity / refillPerSecond = ${secondsToFill(p.capacity, refillPerSecond)} s, so an expired bucket is never fuller than a full one`,
    });
  }
  if (defaultIdleTtl(p.capacity, refillPerSecond) > MAX_IDLE_TTL_SECONDS) {
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

/** A class's filled limits, as a policy carries them once parsed. */
export interface ClassLimits {
  capacity: number;
  refillPerSecond: number;
  maxCost: number;
}

function fillDefaults<T extends PolicyFieldsOut>(
  p: T,
): Omit<T, 'classes'> & {
  refillPerSecond: number;
  maxCost: number;
  idleTtlSeconds: number;
  classes?: Record<string, ClassLimits> | undefined;
} {
  // checkPolicy ran first: a token bucket has its refill and a sliding log its window; so does every class.
  const refillPerSecond = refillOf(p) ?? 0;
  let idleTtlSeconds = p.idleTtlSeconds ?? defaultIdleTtl(p.capacity, refillPerSecond);
  const { minIdleTtlSeconds } = kindOf(p.kind).defaults;
  if (minIdleTtlSeconds !== undefined) idleTtlSeconds = Math.max(idleTtlSeconds, minIdleTtlSeconds);
  let classes: Record<string, ClassLimits> | undefined;
  if (p.classes !== undefined) {
    classes = {};
    for (const [name, raw] of Object.entries(p.classes)) {
      const c = classLimitsOf(p, raw);
      setOwn(classes, name, {
        capacity: c.capacity,
        refillPerSecond: c.refillPerSecond ?? 0,
        maxCost: c.maxCost,
      });
      // One idle TTL serves every class's buckets: long enough for the slowest to refill.
      if (p.idleTtlSeconds === undefined)
        idleTtlSeconds = Math.max(idleTtlSeconds, defaultIdleTtl(c.capacity, c.refillPerSecond ?? 1));
    }
  }
  return {
    ...p,
    refillPerSecond,
    maxCost: p.maxCost ?? Math.min(1, p.capacity),
    idleTtlSeconds,
    ...(classes === undefined ? {} : { classes }),
    // An ip policy's prefixes, filled: what its subjects are bucketed by.
    ...(p.subjectKind === 'ip' ? ipPrefixesOf(p) : {}),
  };
}

/**
 * The policy as a subject of `className` sees it: the class's capacity, refill and largest cost; the policy
 * itself when `className` is undefined. Throws for a class the policy does not define (callers check first).
 */
export function withClass<P extends Pick<Policy, 'capacity' | 'refillPerSecond' | 'maxCost' | 'classes'>>(
  policy: P,
  className: string | undefined,
): P {
  if (className === undefined) return policy;
  const c = ownValue(policy.classes, className);
  if (c === undefined) throw new RangeError(`class ${className} is not defined`);
  return { ...policy, capacity: c.capacity, refillPerSecond: c.refillPerSecond, maxCost: c.maxCost };
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
