/**
 * The coordinator's admin API on the wire: request bodies, query strings and responses. These schemas validate
 * requests, check responses and generate the OpenAPI document, so the API has exactly one definition.
 * Instants are ISO 8601 strings (UTC); durations carry their unit in the field name.
 */
import { z } from 'zod';
import {
  FailureMode,
  MAX_CAPACITY,
  MAX_REFILL_PER_SECOND,
  PolicyMode,
  PolicyName,
  PolicySpec,
  RegionName,
} from './policy.js';

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
    capacity: z.number().describe('burst in tokens'),
    refillPerSecond: z.number().describe('tokens added per second'),
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
  })
  .register(adminSchemas, { id: 'Policy' });
export type PolicyView = z.infer<typeof PolicyView>;

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
    capacity: z.number().positive().max(MAX_CAPACITY).optional(),
    refillPerSecond: z.number().positive().max(MAX_REFILL_PER_SECOND).optional(),
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
  shares: z.record(RegionName, z.number().min(0).max(1)),
  epoch: z.number().int().nonnegative().optional(),
  expiresAt: Instant.nullable().describe('when it starts reverting unless its subject is constrained again'),
});
export type OverrideSummary = z.infer<typeof OverrideSummary>;

/** The allocation of one policy across regions. */
export const AllocationSummary = z.object({
  policy: PolicyName,
  version: z.number().int().positive(),
  epoch: z.number().int().nonnegative(),
  shares: z.record(RegionName, z.number().min(0).max(1)),
  leases: z.record(RegionName, LeaseSummary),
  overrides: z.array(OverrideSummary),
});
export type AllocationSummary = z.infer<typeof AllocationSummary>;

/** `GET /v1/allocations`. */
export const AllocationsResponse = z.object({ policies: z.array(AllocationSummary) });
export type AllocationsResponse = z.infer<typeof AllocationsResponse>;

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
export type PolicyChangeKind = z.infer<typeof PolicyChangeKind>;

/** Who made a change: the role and name of the token used, never the token itself. */
export const AuditActor = z.object({
  role: z.enum(['read', 'write']),
  name: z.string().max(64),
});
export type AuditActor = z.infer<typeof AuditActor>;

/** One audit record as stored in the audit stream. */
export const AuditRecord = z.object({
  at: Instant,
  actor: AuditActor,
  action: PolicyChangeKind,
  policy: PolicyName,
  revision: z.number().int().positive().describe('KV revision (ETag) the change produced'),
  before: PolicyView.nullable(),
  after: PolicyView.nullable(),
  requestId: z.string().max(128),
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
  limit: z.coerce.number().int().min(1).max(MAX_AUDIT_PAGE).default(50),
  before: z.coerce.number().int().positive().optional().describe('only records with seq < before'),
});
export type AuditQuery = z.infer<typeof AuditQuery>;

/** `GET /v1/audit`: newest first; `next` is the `before` of the next (older) page, null at the start. */
export const AuditResponse = z.object({
  entries: z.array(AuditEntry),
  next: z.number().int().positive().nullable(),
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
