/**
 * Write-time rules that need the coordinator's configuration, on top of the policy schema's own
 * (`core/policy/policy.ts`: cost limits ≤ capacity, TTL long enough to refill, strict mode needs a home region…).
 */
import type { z } from 'zod';
import { PolicyBody, type FieldProblem } from '../../core/wire/admin.js';
import { kindOf, type KindName } from '../../core/kinds/index.js';
import { ownRecordOf } from '../../core/own-keys.js';
import { MIN_WRITTEN_CAPACITY, MIN_WRITTEN_REFILL_PER_SECOND } from '../../core/policy/policy.js';
import type { StoredSpec } from './policy-store.js';

/** Problems of zod issues, as `Problem.errors` lists them. */
export function fieldProblems(issues: readonly z.core.$ZodIssue[], prefix = ''): FieldProblem[] {
  return issues.map((i) => ({
    path: [prefix, ...i.path.map(String)].filter((p) => p !== '').join('.'),
    message: i.message,
  }));
}

/**
 * The policy body schema of this deployment: the schema's own rules, plus `homeRegion` among the configured
 * regions and the `minShare` floors of all regions fitting in the budget. Used by the route (so one answer
 * lists every problem) and by the store (so no caller bypasses it).
 */
export function policyBodyFor(regions: readonly string[]) {
  return PolicyBody.superRefine((body, ctx) => {
    writtenMinimums(body, ctx);
    if (body.homeRegion !== undefined && !regions.includes(body.homeRegion)) {
      ctx.addIssue({
        code: 'custom',
        path: ['homeRegion'],
        message: `homeRegion must be one of the configured regions (${regions.join(', ')})`,
      });
    }
    if (body.minShare !== undefined && body.minShare * regions.length > 1 + 1e-12) {
      ctx.addIssue({
        code: 'custom',
        path: ['minShare'],
        message: `minShare × ${regions.length} regions must be ≤ 1, or the floors alone exceed the budget`,
      });
    }
  });
}

/**
 * The smallest quantities an operator may write (core/policy/limits.ts MIN_WRITTEN_*): `capacity` and `maxCost` of the
 * policy and of each class at least a thousandth of a token, `refillPerSecond` at least one micro-token a
 * second. A 400 COORD_ERR_VALIDATION naming each field, like every schema problem.
 */
function writtenMinimums(body: PolicyBody, ctx: z.RefinementCtx): void {
  const least = (path: string[], value: number | undefined, min: number, what: string) => {
    // A value ≤ 0 already has its problem ("must be > 0"); one problem per field.
    if (value !== undefined && value > 0 && value < min)
      ctx.addIssue({ code: 'custom', path, message: `${what} must be ≥ ${min}` });
  };
  const limits = (
    at: string[],
    l: { capacity: number; refillPerSecond?: number | undefined; maxCost?: number | undefined },
  ) => {
    least([...at, 'capacity'], l.capacity, MIN_WRITTEN_CAPACITY, 'capacity');
    least([...at, 'maxCost'], l.maxCost, MIN_WRITTEN_CAPACITY, 'maxCost');
    least([...at, 'refillPerSecond'], l.refillPerSecond, MIN_WRITTEN_REFILL_PER_SECOND, 'refillPerSecond');
  };
  limits([], body);
  for (const [name, c] of Object.entries(body.classes ?? {})) limits(['classes', name], c);
}

/** Largest value of the policies bucket (its `maxValueSize`, coordinator/nats/open-stores.ts). */
export const POLICY_VALUE_MAX_BYTES = 16 * 1024;
/**
 * Largest stored spec (its JSON, the KV value) a write accepts: JetStream counts the headers of the conditional
 * write (`Nats-Expected-Last-Subject-Sequence`, about 60 bytes) in the bucket's limit, so some room is left.
 */
export const MAX_STORED_SPEC_BYTES = POLICY_VALUE_MAX_BYTES - 256;

/** Validate a spec for this deployment: the parsed body (constant defaults filled) or every problem found. */
export function validateSpec(
  name: string,
  input: unknown,
  schema: ReturnType<typeof policyBodyFor>,
): { ok: true; spec: StoredSpec } | { ok: false; problems: FieldProblem[] } {
  const parsed = schema.safeParse(input);
  if (!parsed.success) return { ok: false, problems: fieldProblems(parsed.error.issues) };
  const spec = canonicalSpec(name, parsed.data);
  // A value the bucket cannot hold is the caller's mistake, never a store failure worth retrying.
  const bytes = Buffer.byteLength(JSON.stringify(spec), 'utf8');
  if (bytes > MAX_STORED_SPEC_BYTES) {
    return {
      ok: false,
      problems: [
        {
          path: '',
          message: `the policy takes ${bytes} bytes stored, more than the ${MAX_STORED_SPEC_BYTES} a policy may take (fewer named subjects or classes)`,
        },
      ],
    };
  }
  return { ok: true, spec };
}

const ORDER = [
  'kind',
  'capacity',
  'refillPerSecond',
  'windowSeconds',
  'leaseSeconds',
  'timeZone',
  'shards',
  'maxCost',
  'mode',
  'homeRegion',
  'onStoreFailure',
  'idleTtlSeconds',
  'version',
  'minShare',
  'classes',
  'subjects',
  'newSubjects',
  'subjectKind',
  'ipv4Prefix',
  'ipv6Prefix',
] as const;

/**
 * The spec with its name, keys in one fixed order, so equal specs serialize to equal bytes. The default kind is
 * left out, so the specs stored before kinds existed stay byte for byte what a PUT of them writes now.
 */
export function canonicalSpec(name: string, body: PolicyBody): StoredSpec {
  const out: Record<string, unknown> = { name };
  for (const k of ORDER) if (body[k] !== undefined) out[k] = body[k];
  if (out['kind'] === 'token_bucket') delete out['kind'];
  // A derived rate (a sliding log's, a concurrency policy's, a daily budget's) is kept out, so a later budget
  // change re-derives it from the new capacity.
  if (kindOf((out['kind'] as KindName | undefined) ?? 'token_bucket').rate !== 'declared') {
    delete out['refillPerSecond'];
    // A class's derived rate too (sent back as an answer showed it, it is the same class).
    if (body.classes !== undefined) {
      out['classes'] = ownRecordOf(
        Object.entries(body.classes).map(([name, { refillPerSecond: _rate, ...limits }]) => [name, limits]),
      );
    }
  }
  return out as StoredSpec;
}
