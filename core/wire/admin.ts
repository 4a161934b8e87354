/**
 * The coordinator's admin API on the wire: request bodies, query strings and responses. These schemas validate
 * requests, check responses and generate the OpenAPI document, so the API has exactly one definition.
 * Instants are ISO 8601 strings (UTC); durations carry their unit in the field name.
 */
import { z } from 'zod';
import { ownRecordOf, replyRecord } from '../own-keys.js';
import { roundDerivedRate } from '../admin-numbers.js';
import { kindOf } from '../kinds/index.js';
import {
  FailureMode,
  MAX_CAPACITY,
  MAX_REFILL_PER_SECOND,
  MIN_WRITTEN_CAPACITY,
  MIN_WRITTEN_REFILL_PER_SECOND,
  PolicyKind,
  PolicyMode,
  PolicyName,
  PolicySpec,
  RegionName,
  SubjectKind,
  type Policy,
} from '../policy/policy.js';
import { DecimalText } from './decimal-text.js';

/**
 * Schemas the OpenAPI document names as components (`#/components/schemas/<id>`). A registry of its own, not
 * zod's global one, so another service's schemas in the same process never leak into this document.
 */
export const adminSchemas = z.registry<{ id: string }>();

/**
 * The body of `PUT /v1/policies/{name}`: the operator's spec, validated with every cross-field rule of
 * `PolicySpec`. Parsing fills the constant defaults (`mode`, `onStoreFailure`, `version`) but leaves the
 * derived ones (`maxCost`, `idleTtlSeconds`) absent unless the operator set them: the store keeps them that
 * way, so a later budget change re-derives them.
 */
export const PolicyBody = PolicySpec.in;
export type PolicyBody = z.output<typeof PolicyBody>;

/** A stored policy as the API returns it: the name and every default filled (the output of `Policy`). */
export const PolicyView = z
  .strictObject({
    name: PolicyName,
    kind: PolicyKind,
    capacity: z
      .number()
      .describe('burst in tokens (sliding_log: events in any rolling window; concurrency: slots in flight)'),
    refillPerSecond: z
      .number()
      .describe(
        'tokens added per second (sliding_log: capacity / windowSeconds; concurrency: capacity / leaseSeconds; derived)',
      ),
    windowSeconds: z.number().int().optional().describe('rolling window of a sliding_log policy'),
    shards: z.number().int().optional().describe('sub-buckets of a hot token-bucket key'),
    timeZone: z.string().optional().describe('IANA time zone whose calendar days a daily policy counts'),
    leaseSeconds: z
      .number()
      .int()
      .optional()
      .describe('lease TTL of a concurrency policy: an unreleased slot comes back after it'),
    maxCost: z.number().describe('largest cost one request may ask for'),
    mode: PolicyMode,
    homeRegion: RegionName.optional(),
    onStoreFailure: FailureMode,
    idleTtlSeconds: z
      .number()
      .int()
      .describe('TTL of an idle bucket; at least the time to refill from empty'),
    version: z.number().int(),
    minShare: z.number().optional(),
    classes: replyRecord(
      z.string(),
      z.strictObject({ capacity: z.number(), refillPerSecond: z.number(), maxCost: z.number() }),
    )
      .optional()
      .describe('subject classes and their limits (refill and maxCost filled)'),
    subjects: replyRecord(z.string(), z.string()).optional().describe('named subjects and their class'),
    newSubjects: z
      .strictObject({ perMinute: z.number().int(), flood: z.enum(['deny', 'shared']) })
      .optional()
      .describe('subject-creation cap: new buckets per rolling minute per region, and the flood answer'),
    subjectKind: SubjectKind.optional().describe(
      'ip: subjects are client addresses, bucketed by prefix (absent: any text)',
    ),
    ipv4Prefix: z
      .number()
      .int()
      .optional()
      .describe('bits of an IPv4 address one subject covers (ip policies)'),
    ipv6Prefix: z
      .number()
      .int()
      .optional()
      .describe('bits of an IPv6 address one subject covers (ip policies)'),
  })
  .register(adminSchemas, { id: 'Policy' });
export type PolicyView = z.infer<typeof PolicyView>;

/**
 * A stored policy as admin answers show it: as stored, but a derived `refillPerSecond` (a sliding log's, a
 * concurrency policy's, a daily budget's: capacity over their window) rounded (roundDerivedRate), and so is each
 * class's (its capacity over the same window); a policy body may send those rounded values back.
 */
export function policyView(policy: Policy): PolicyView {
  if (kindOf(policy.kind).rate === 'declared') return policy;
  const { classes } = policy;
  return {
    ...policy,
    refillPerSecond: roundDerivedRate(policy.refillPerSecond),
    // Each class's rate is derived from its capacity the same way, and shown the same way.
    ...(classes === undefined
      ? {}
      : {
          classes: ownRecordOf(
            Object.entries(classes).map(([name, c]) => [
              name,
              { ...c, refillPerSecond: roundDerivedRate(c.refillPerSecond) },
            ]),
          ),
        }),
  };
}

/** `GET /v1/policies`: every policy, sorted by name. */
export const PolicyList = z.object({ policies: z.array(PolicyView) });
export type PolicyList = z.infer<typeof PolicyList>;

/** Path parameters of the per-policy routes. */
export const PolicyParams = z.object({ name: PolicyName });
export type PolicyParams = z.infer<typeof PolicyParams>;

/**
 * `PATCH /v1/policies/{name}/budget`: an operator's budget adjustment. At least one field. The result is
 * validated as a whole policy; `maxCost` and `idleTtlSeconds` that were never set are re-derived from it.
 */
export const BudgetPatch = z
  .strictObject({
    capacity: z
      .number()
      .min(MIN_WRITTEN_CAPACITY, `capacity must be ≥ ${MIN_WRITTEN_CAPACITY}`)
      .max(MAX_CAPACITY)
      .optional(),
    refillPerSecond: z
      .number()
      .min(MIN_WRITTEN_REFILL_PER_SECOND, `refillPerSecond must be ≥ ${MIN_WRITTEN_REFILL_PER_SECOND}`)
      .max(MAX_REFILL_PER_SECOND)
      .optional(),
  })
  .refine((p) => p.capacity !== undefined || p.refillPerSecond !== undefined, {
    message: 'give capacity, refillPerSecond or both',
  });
export type BudgetPatch = z.infer<typeof BudgetPatch>;

/** One problem with a request field, in `Problem.errors`. */
export const FieldProblem = z.object({
  path: z.string().describe('dotted path of the field, empty for the whole body'),
  message: z.string(),
});
export type FieldProblem = z.infer<typeof FieldProblem>;

/** An RFC 9457 problem document with a stable `code` (docs/errors.md). */
export const Problem = z
  .object({
    type: z.string(),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    code: z.string().describe('stable COORD_ERR_* code'),
    instance: z.string().optional(),
    requestId: z.string().optional(),
    errors: z.array(FieldProblem).optional(),
  })
  .register(adminSchemas, { id: 'Problem' });
export type Problem = z.infer<typeof Problem>;

const Instant = z.iso.datetime().describe('ISO 8601 instant, UTC');

/** One region's lease of one policy, as the coordinator last issued it. */
export const LeaseSummary = z.object({
  expiresAt: Instant.nullable().describe(
    "latest lease end among the region's agents; null if none renewed yet",
  ),
  acked: z.boolean().describe('every live agent of the region acknowledged this epoch'),
});
export type LeaseSummary = z.infer<typeof LeaseSummary>;

/** A per-subject share vector that replaces the policy's default vector for one subject. */
export const OverrideSummary = z.object({
  subject: z.string().describe('normalized or hashed subject, never a raw identity'),
  shares: replyRecord(RegionName, z.number().min(0).max(1)),
  epoch: z.number().int().nonnegative().optional(),
  expiresAt: Instant.nullable().describe('when it starts reverting unless its subject is constrained again'),
});
export type OverrideSummary = z.infer<typeof OverrideSummary>;

const Share = z.number().min(0).max(1).describe('fraction of the global budget, rounded to 4 decimals');
const Rate = z.number().nonnegative().describe('tokens per second, rounded to 3 decimals');

/**
 * Why the shares of a policy moved.
 * - `created`: the policy's first allocation (an equal split, floors respected).
 * - `demand`: the rebalancer stepped toward the smoothed demand of the regions (`target`), because some region
 *   it grows had unmet demand (`unmet`) for the confirmation time.
 * - `lapsed_region`: agents of some region lapsed or went silent; the budget was restored around them.
 * - `unallocated`: the shares summed below 1 with no step due (after a lapse, or as restored); the rest of the
 *   budget was handed out.
 */
export const MoveReason = z.enum(['created', 'demand', 'lapsed_region', 'unallocated']);
export type MoveReason = z.infer<typeof MoveReason>;

/** One change of a policy's default share vector, as written to the allocation record. */
export const ShareMove = z.object({
  at: Instant,
  policy: PolicyName,
  epoch: z.number().int().nonnegative(),
  revision: z.number().int().positive().describe('KV revision of the allocation record that carried it'),
  from: replyRecord(RegionName, Share).nullable().describe('null for the first allocation'),
  to: replyRecord(RegionName, Share),
  reason: MoveReason,
  demand: replyRecord(RegionName, Rate).describe('smoothed demand per region when it moved'),
  unmet: replyRecord(RegionName, Rate)
    .optional()
    .describe('smoothed unmet demand per region (refused within limits, or borrowed) when it moved'),
  target: replyRecord(RegionName, Share)
    .nullable()
    .optional()
    .describe('shares the move heads for (a move takes several steps); null when it follows no demand'),
});
export type ShareMove = z.infer<typeof ShareMove>;

/** What one region holds of one policy, and what it does with it. */
export const RegionAllocation = z.object({
  share: Share.describe('share issued, in force once acknowledged'),
  pending: Share.nullable().describe('share held before a shrink not every agent acknowledged; null if none'),
  capacity: Rate.describe('burst this region enforces per subject: capacity × share, tokens (3 decimals)'),
  refillPerSecond: Rate.describe('refill this region enforces per subject: refill × share'),
  demandPerSecond: Rate.describe('smoothed requested cost the rebalancer steers by'),
  admittedPerSecond: Rate.describe('smoothed admitted cost, from usage reports'),
  refusedPerSecond: Rate.describe('smoothed refused cost, from usage reports'),
  lease: z.object({
    expiresAt: Instant.nullable(),
    acked: z.boolean(),
    holders: z.array(z.string()).describe('instances of the live agents holding the lease'),
    renewedAt: Instant.nullable().describe('latest heartbeat of a holder (the lease age is now − renewedAt)'),
  }),
});
export type RegionAllocation = z.infer<typeof RegionAllocation>;

/** The allocation of one policy across regions. */
export const AllocationSummary = z.object({
  policy: PolicyName,
  version: z.number().int().positive(),
  epoch: z.number().int().nonnegative(),
  shares: replyRecord(RegionName, z.number().min(0).max(1)),
  leases: replyRecord(RegionName, LeaseSummary),
  overrides: z.array(OverrideSummary),
  budget: z.object({ capacity: z.number(), refillPerSecond: z.number() }).optional(),
  /** Per region, the share and what it gives; present when the protocol engine runs. */
  regions: replyRecord(RegionName, RegionAllocation).optional(),
  /** The latest moves of the default share vector, newest first (at most 10). */
  moves: z.array(ShareMove).optional(),
});
export type AllocationSummary = z.infer<typeof AllocationSummary>;

/** `GET /v1/allocations`. */
export const AllocationsResponse = z.object({ policies: z.array(AllocationSummary) });
export type AllocationsResponse = z.infer<typeof AllocationsResponse>;

/** One sample of a policy's allocation, taken every rebalance round. */
export const AllocationSample = z.object({
  at: Instant,
  shares: replyRecord(RegionName, Share),
  demand: replyRecord(RegionName, Rate),
  admitted: replyRecord(RegionName, Rate),
  refused: replyRecord(RegionName, Rate),
});
export type AllocationSample = z.infer<typeof AllocationSample>;

/** Query of `GET /v1/allocations/history`. */
export const HistoryQuery = z.strictObject({ policy: PolicyName });

/** `GET /v1/allocations/history?policy=`: the samples the coordinator keeps, oldest first. */
export const AllocationHistory = z.object({ policy: PolicyName, samples: z.array(AllocationSample) });
export type AllocationHistory = z.infer<typeof AllocationHistory>;

/** What the coordinator knows of one configured region. */
export const RegionSummary = z.object({
  region: RegionName,
  lastReportAt: Instant.nullable().describe('when the last usage report arrived; null if none yet'),
  agents: z.number().int().nonnegative().describe('agents heard from within the last lease length'),
  reportLagMs: z
    .number()
    .nonnegative()
    .nullable()
    .describe('age of the last report at the time of the request; null if none yet'),
  shedPerSecond: z
    .number()
    .nonnegative()
    .optional()
    .describe(
      "decision requests the region's agents shed per second (admission control), over their last heartbeats",
    ),
  agentDetails: z
    .array(
      z.object({
        agentId: z.string(),
        instance: z.string(),
        lastHeartbeatAt: Instant.nullable(),
        leaseUntil: Instant.nullable(),
        appliedRevision: z.number().int().nonnegative(),
        ackRevision: z.number().int().nonnegative(),
        lapsed: z.boolean().describe('counted at its safe share: lease lapsed or not yet confirmed valid'),
        shedPerSecond: z
          .number()
          .nonnegative()
          .describe('decision requests shed per second over its last heartbeat'),
      }),
    )
    .optional(),
});
export type RegionSummary = z.infer<typeof RegionSummary>;

/** `GET /v1/regions`: one entry per configured region, in configuration order. */
export const RegionsResponse = z.object({ regions: z.array(RegionSummary) });
export type RegionsResponse = z.infer<typeof RegionsResponse>;

/** The kinds of change the audit trail and the change events know. */
export const PolicyChangeKind = z.enum(['create', 'replace', 'budget', 'delete']);
/**
 * What an audit record describes: a policy change, a move of the shares (`move`), a KV entry the coordinator
 * did not write, found and undone (`restore`), or admin requests refused for their credentials (`refused`).
 */
export const AuditAction = z.enum([...PolicyChangeKind.options, 'move', 'restore', 'refused']);
export type PolicyChangeKind = z.infer<typeof PolicyChangeKind>;

/** Who made a change: the role and name of the token used, never the token itself. */
export const AuditActor = z.object({
  role: z
    .enum(['read', 'write', 'system', 'none'])
    .describe(
      'system: the coordinator itself (name: rebalancer, kv-guard); none: no valid token (name: missing, invalid)',
    ),
  name: z.string().max(64),
});
export type AuditActor = z.infer<typeof AuditActor>;

/** Why an admin request was refused for its credentials. */
export const RefusalReason = z.enum(['missing', 'invalid', 'forbidden']);
export type RefusalReason = z.infer<typeof RefusalReason>;

/** One audit record as stored in the audit stream. */
export const AuditRecord = z.object({
  at: Instant,
  actor: AuditActor,
  action: AuditAction,
  /** The policy concerned; absent only for `refused` records of requests that named none. */
  policy: PolicyName.optional(),
  /** Absent only for `refused` records. */
  revision: z
    .number()
    .int()
    .positive()
    .optional()
    .describe(
      'KV revision the change produced: the policy ETag, for a move the allocation record, for a restore the foreign entry',
    ),
  before: PolicyView.nullable(),
  after: PolicyView.nullable(),
  requestId: z.string().max(128),
  /** Address the request came from (admin requests; absent for the coordinator's own records). */
  source: z.string().max(64).optional(),
  /** For `move`: the shares before and after, and why. */
  move: ShareMove.pick({
    epoch: true,
    from: true,
    to: true,
    reason: true,
    demand: true,
    unmet: true,
    target: true,
  }).optional(),
  /**
   * For `create`/`replace` over a policy whose units changed (core/policy/policy-version.ts): the coordinator moved
   * its version from `from` to `to` because of `fields`, so decisions count on fresh keys.
   */
  versionBump: z
    .object({
      from: z.number().int().positive(),
      to: z.number().int().positive(),
      fields: z.array(z.string().max(32)).max(16),
    })
    .optional(),
  /** For `restore`: the bucket of the foreign entry (whose revision is `revision`) and what it did. */
  restored: z.object({ bucket: z.string().max(64), operation: z.enum(['put', 'delete']) }).optional(),
  /**
   * For `refused`: why, the first request's method and route, and how many requests of that source were refused
   * for that reason within the window (`at` is the window's first).
   */
  refused: z
    .object({
      reason: RefusalReason,
      method: z.string().max(16),
      route: z.string().max(128),
      attempts: z.number().int().positive(),
    })
    .optional(),
});
export type AuditRecord = z.infer<typeof AuditRecord>;

/** An audit record with its position in the trail. */
export const AuditEntry = AuditRecord.extend({
  seq: z.number().int().positive().describe('position in the audit trail; pass as `before` to page back'),
});
export type AuditEntry = z.infer<typeof AuditEntry>;

/** Largest page of `GET /v1/audit`. */
export const MAX_AUDIT_PAGE = 1000;

/** Query of `GET /v1/audit`. */
export const AuditQuery = z.strictObject({
  policy: PolicyName.optional(),
  limit: DecimalText.pipe(z.number().int().min(1).max(MAX_AUDIT_PAGE)).default(50),
  before: DecimalText.pipe(z.number().int().positive()).optional().describe('only records with seq < before'),
  moves: z
    .enum(['show', 'hide'])
    .optional()
    .describe(
      "the rebalancer's share moves: `show` them (default), or `hide` them and count them in `movesHidden`",
    ),
});
export type AuditQuery = z.infer<typeof AuditQuery>;

/** `GET /v1/audit`: newest first; `next` is the `before` of the next (older) page, null at the start. */
export const AuditResponse = z.object({
  entries: z.array(AuditEntry),
  next: z.number().int().positive().nullable(),
  movesHidden: z
    .number()
    .int()
    .nonnegative()
    .optional()
    .describe('with `moves=hide`: the moves left out between the oldest entry of the page and its end'),
});
export type AuditResponse = z.infer<typeof AuditResponse>;

/** `GET /healthz`. */
export const HealthResponse = z.object({ status: z.literal('ok') });

/** `GET /readyz`: 200 when ready, 503 with the reasons when not. */
export const ReadinessResponse = z.object({
  ready: z.boolean(),
  reasons: z.array(z.string()),
});
export type ReadinessResponse = z.infer<typeof ReadinessResponse>;
