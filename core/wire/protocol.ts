/**
 * The coordination protocol on the wire, shared by the coordinator and the agents: NATS subjects, message schemas
 * and the allocation record kept in JetStream KV. Every inbound message is checked against these schemas; a bad
 * one is counted and dropped.
 *
 * Flow: agents watch the allocation records (KV bucket `<ns>-allocations`, key = policy key) and send a heartbeat
 * every report interval (request/reply); the reply renews the agent's lease. Usage goes in separate bounded
 * messages. When an agent has applied a record revision and every decision it started under older records has
 * finished, it acknowledges that revision (`ackRevision`) in an ack message and in every heartbeat.
 */
import { z } from 'zod';
import { ownRecord } from '../own-keys.js';
import { PolicyName, RegionName } from '../policy/policy.js';
import { KvNamespace } from './kv.js';

/**
 * The tag of the credential an agent connects with, carried as the last token of the subjects it publishes on:
 * the NATS server lets each agent's nkey publish only under its own tag (core/wire/nats-permissions.ts), and an
 * agent's id starts with it (`<tag>_<random>`), so the coordinator can tell that a message about an agent comes
 * from that agent's credential. `open` on servers without credentials (nothing is bound there).
 */
export const OPEN_CREDENTIAL_TAG = 'open';

/** The credential tag of an nkey public key (`U…`, base32): its first 24 characters. */
export function credentialTag(publicKey: string): string {
  const tag = publicKey.slice(0, 24);
  if (!/^[A-Z2-7]{24}$/.test(tag)) throw new RangeError('not an nkey public key');
  return tag;
}

/** The credential tag an agent id was made under (`<tag>_<random>`), or undefined for an untagged id. */
export function agentIdTag(agentId: string): string | undefined {
  const i = agentId.indexOf('_');
  return i > 0 ? agentId.slice(0, i) : undefined;
}

/**
 * NATS subjects of one namespace (see core/wire/kv.ts): `<ns>.v1.<kind>.<region>.<tag>`, the sender's region
 * and credential tag. Coordinators read the older untagged `<ns>.v1.<kind>.<region>` too (agents that predate
 * tags); a server with credentials lets no agent publish there.
 */
export function protocolSubjects(namespace: string, tag?: string) {
  const ns = KvNamespace.parse(namespace);
  const at = (kind: string, region: string): string =>
    tag === undefined ? `${ns}.v1.${kind}.${region}` : `${ns}.v1.${kind}.${region}.${tag}`;
  return {
    heartbeat: (region: string) => at('heartbeat', region),
    usage: (region: string) => at('usage', region),
    ack: (region: string) => at('ack', region),
    bye: (region: string) => at('bye', region),
    all: {
      heartbeat: `${ns}.v1.heartbeat.>`,
      usage: `${ns}.v1.usage.>`,
      ack: `${ns}.v1.ack.>`,
      bye: `${ns}.v1.bye.>`,
    },
  } as const;
}

/**
 * The sender of a message on a protocol subject: its region and credential tag (undefined on an untagged
 * subject), or undefined when the subject has neither shape.
 */
export function protocolSender(subject: string): { region: string; tag: string | undefined } | undefined {
  const tokens = subject.split('.');
  if (tokens.length === 4) return { region: tokens[3]!, tag: undefined };
  if (tokens.length === 5) return { region: tokens[3]!, tag: tokens[4]! };
  return undefined;
}
export type ProtocolSubjects = ReturnType<typeof protocolSubjects>;

/** Largest number of constrained subjects an agent reports per policy per interval. */
export const MAX_CONSTRAINED_PER_POLICY = 8;
/** Largest number of subjects a policy's record asks every agent to report (override candidates). */
export const MAX_WATCHED_PER_POLICY = 32;
/** Largest number of policies in one usage message; an agent sends more messages when it needs to. */
export const MAX_POLICIES_PER_USAGE = 512;
/** Largest number of usage messages per interval per agent (bounds a report to 32k policies). */
export const MAX_USAGE_CHUNKS = 64;
/** Longest subject in a report (normalized or hashed subjects only, never raw identities). */
const ReportedSubject = z.string().min(1).max(128);

/**
 * The one reported subject that cannot be a key of a record's `overrides`: `ownRecord` (core/own-keys.ts) refuses
 * an own `__proto__` key (exactly that text, case included) in every record it parses, so a record holding an
 * override of it would fail AllocationRecord on every agent, which would then keep its last good record of the
 * policy for good. Any other subject a report may carry (ReportedSubject) is a valid key.
 */
export const UNRECORDABLE_SUBJECT = '__proto__';

/**
 * True when `subject` can be a key of an allocation record (an override or a watch entry the record keeps for it
 * is readable). A report still carries such a subject (ReportedSubject takes it: its usage counts); the
 * coordinator tracks no demand of it, so it never gets an override or a place on the watch list.
 */
export function isRecordableSubject(subject: string): boolean {
  return subject !== UNRECORDABLE_SUBJECT;
}

export const AgentId = z
  .string()
  .regex(/^[A-Za-z0-9_-]{8,64}$/, 'agent ids are 8-64 chars of A-Z a-z 0-9 _ -');
export const Instance = z.string().min(1).max(128);

const Cost = z.number().min(0).max(1e15);
/** A coordinator's epoch: bumped by every coordinator that takes the leader lease (coordinator/leadership). */
export const LeaderEpoch = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER);
const Revision = z.number().int().min(0);

/** An agent's heartbeat; the reply renews its lease. */
export const Heartbeat = z.strictObject({
  agentId: AgentId,
  /** Stable name of the agent process (e.g. host:port); a new agent with the same name replaces the old one. */
  instance: Instance,
  region: RegionName,
  seq: z.number().int().min(0),
  /** Highest allocation-record revision the agent has applied. */
  appliedRevision: Revision,
  /** Highest revision such that no decision started under an older record is still in flight. */
  ackRevision: Revision,
  /**
   * The agent's lease state when it sent this: `valid` (issued shares), `lapsed` (min(issued, safe)), `settled`
   * (safe shares) or `none` (not deciding yet). The coordinator counts an agent at its safe share until it
   * reports `valid`.
   */
  mode: z.enum(['none', 'valid', 'lapsed', 'settled']),
  /**
   * `seq` of the heartbeat whose renewal the agent's lease in force comes from (-1: none). The coordinator knows
   * when it granted that renewal, and agents ignore replies later than one report interval, so the lease lasts at
   * least until that grant + leaseMs - reportIntervalMs: until then the agent is surely not at its safe share.
   */
  renewedSeq: z.number().int().min(-1),
  /**
   * Decision requests the agent's admission control shed since its previous heartbeat (absent from agents that
   * predate it). Shed work is refused before any policy is read, so it is counted per agent, not per policy.
   */
  shed: z.number().int().min(0).max(1e9).optional(),
});
export type Heartbeat = z.infer<typeof Heartbeat>;

/** The coordinator's answer to a heartbeat. */
export const Renewal = z.strictObject({
  coordinatorId: z.string().min(1).max(64),
  /** The lease lasts this long from when the agent sent its heartbeat (so clock offsets do not matter). */
  leaseMs: z.number().int().positive(),
  /** After expiry, the agent keeps min(share, safe share); after this much more, it settles at the safe share. */
  graceMs: z.number().int().positive(),
  /**
   * The lease counts only once the agent has applied allocation records up to this revision: the latest
   * shrink of the agent's region. An agent that is behind catches up first.
   */
  minRevision: Revision,
  /** True while the coordinator is in learning mode after a restart (it grows nothing). */
  learning: z.boolean(),
  /** How often the coordinator wants heartbeats and usage, ms (agents follow it). */
  reportIntervalMs: z.number().int().positive(),
  /**
   * The answering coordinator's epoch (its term as leader, coordinator/leadership): an agent that has seen a
   * higher one ignores this reply (a coordinator that lost its lease). Absent from coordinators without election.
   */
  leaderEpoch: LeaderEpoch.optional(),
});
export type Renewal = z.infer<typeof Renewal>;

/** A refused heartbeat (unknown region, agent id reused in another region…). */
export const RenewalRefused = z.strictObject({ refused: z.string().max(200) });
export type RenewalRefused = z.infer<typeof RenewalRefused>;

export const RenewalReply = z.union([Renewal, RenewalRefused]);
export type RenewalReply = z.infer<typeof RenewalReply>;

/** Cost requested, admitted and denied for one subject that was denied or close to its regional capacity. */
export const ConstrainedSubject = z.strictObject({
  subject: ReportedSubject,
  requested: Cost,
  denied: Cost,
});
export type ConstrainedSubject = z.infer<typeof ConstrainedSubject>;

export const PolicyUsage = z.strictObject({
  policy: PolicyName,
  requested: Cost,
  admitted: Cost,
  denied: Cost,
  /**
   * Cost the policy's subjects could use here under their own limits: what was admitted, plus refusals of
   * subjects that stayed within their global rate over the interval (core/shares/usage-accounting.ts). What shares
   * follow; absent from older agents, where the coordinator falls back to `requested`.
   */
  demand: Cost.optional(),
  /**
   * Tokens borrowed from other regions and credited here (core/borrowing/): demand this region's own refill did
   * not cover. With refusals within limits, what tells the coordinator a region needs more of the refill; absent
   * from agents that do not borrow.
   */
  imported: Cost.optional(),
  constrained: z.array(ConstrainedSubject).max(MAX_CONSTRAINED_PER_POLICY),
  /**
   * True when more subjects were constrained than the report carries: a subject missing from `constrained` may
   * still have been constrained. False or absent: the list is complete.
   */
  truncated: z.boolean().optional(),
  /**
   * Every subject the policy's record watches, with what it asked here this interval (zero included), so the
   * coordinator knows a candidate's demand in every region, not only where it was constrained.
   */
  watched: z.array(ConstrainedSubject).max(MAX_WATCHED_PER_POLICY).optional(),
});
export type PolicyUsage = z.infer<typeof PolicyUsage>;

/** One interval's usage of one agent, possibly in several chunks. */
export const Usage = z.strictObject({
  agentId: AgentId,
  region: RegionName,
  seq: z.number().int().min(0),
  /** Length of the interval the figures cover, ms. */
  intervalMs: z.number().int().positive().max(3_600_000),
  chunk: z
    .number()
    .int()
    .min(0)
    .max(MAX_USAGE_CHUNKS - 1),
  chunks: z.number().int().min(1).max(MAX_USAGE_CHUNKS),
  policies: z.array(PolicyUsage).max(MAX_POLICIES_PER_USAGE),
  /** Policies left out because the report would exceed its bound. */
  dropped: z.number().int().min(0),
});
export type Usage = z.infer<typeof Usage>;

export const Ack = z.strictObject({ agentId: AgentId, region: RegionName, ackRevision: Revision });
export type Ack = z.infer<typeof Ack>;

export const Bye = z.strictObject({ agentId: AgentId, region: RegionName });
export type Bye = z.infer<typeof Bye>;

const Share = z.number().min(0).max(1);
const ShareByRegion = ownRecord(RegionName, Share);

/** One allocation unit: the default vector of a policy, or a per-subject override. */
export const UnitRecord = z.strictObject({
  /** Shares issued, by region: the most recent the coordinator wrote. */
  shares: ShareByRegion,
  /** Regions shrinking: the share each held before, until all its agents acknowledge (coordinator bookkeeping). */
  pending: ShareByRegion,
  /** Bumped on every change of this unit. */
  epoch: z.number().int().min(0),
  /**
   * The lowest share each region was issued within the policy's idle TTL (plus the skew margin on both sides),
   * for regions where it is below the share issued now (absent: none). Sliding-log, concurrency and daily
   * decisions size a region by the lowest share it held within the window; an agent that restarted or was added
   * knows it from here, not only from its own memory. Agents from before it refuse a record carrying it: upgrade
   * agents before the coordinator (docs/protocol.md).
   */
  lowest: ShareByRegion.optional(),
});
export type UnitRecord = z.infer<typeof UnitRecord>;

/** The allocation record of one regional policy: the KV value agents adopt. */
export const AllocationRecord = z.strictObject({
  policy: PolicyName,
  version: z.number().int().positive(),
  /** Bumped on every change of the record. */
  epoch: z.number().int().min(0),
  /** Safe static shares (sum ≤ 1): what an agent settles at when its lease has lapsed for longer than the grace. */
  safe: ShareByRegion,
  /** The policy's idle TTL: how far back an agent keeps the history of its shares for refill floors. */
  idleTtlSeconds: z.number().int().positive(),
  default: UnitRecord,
  /** Per-subject overrides (capped), by normalized subject. */
  overrides: ownRecord(ReportedSubject, UnitRecord),
  /** Subjects every agent reports for this policy each interval (override candidates and overrides). */
  watch: z.array(ReportedSubject).max(MAX_WATCHED_PER_POLICY).optional(),
  updatedAt: z.number(),
  /**
   * Epoch of the coordinator that wrote the record (coordinator/leadership): an agent that has seen a higher one
   * keeps its last good record instead. Absent from coordinators without election.
   */
  leaderEpoch: LeaderEpoch.optional(),
});
export type AllocationRecord = z.infer<typeof AllocationRecord>;

/** What the coordinator remembers of an agent across restarts. */
export const AgentRegistration = z.strictObject({
  agentId: AgentId,
  instance: Instance,
  region: RegionName,
  registeredAt: z.number(),
});
export type AgentRegistration = z.infer<typeof AgentRegistration>;
