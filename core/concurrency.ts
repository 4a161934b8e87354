/**
 * Concurrency leases: a `concurrency` policy is a sliding log whose window is the lease TTL (core/sliding-log.ts,
 * `lua/sliding_log.lua`): acquiring a slot writes one entry per unit of cost, stamped with Redis time; the slot is
 * held while the entry is in the window (`leaseSeconds`) and comes back when it is released
 * (`lua/sliding_log_refund.lua` removes exactly the entries the acquire wrote) or when the lease runs out, so a
 * crashed holder never keeps a slot longer than its lease.
 *
 * A lease is named by an opaque token the agent hands back with the decision: it says which region's store, which
 * log (policy, version, normalized subject) and which entries (stamp, first sequence number, cost) to remove.
 */
import { z } from 'zod';
import { PolicyName, RegionName } from './policy.js';
import { slidingLogKey, type LogRefund } from './sliding-log.js';

/** Prefix of every lease token; a future format gets another. */
const TOKEN_PREFIX = 'l1.';
/** Longest token accepted: a normalized subject is at most 96 characters (hashed ones are shorter). */
export const MAX_LEASE_TOKEN_LENGTH = 512;

/** What a lease token names. */
export const Lease = z.strictObject({
  region: RegionName,
  policy: PolicyName,
  version: z.number().int().positive(),
  /** The normalized (or hashed) subject, as the log key holds it. */
  subject: z.string().min(1).max(128),
  /** µs of Redis time the entries were stamped with (their score). */
  stamp: z.number().int().positive(),
  /** Sequence number of the first entry. */
  seq: z.number().int().min(0),
  /** Slots the lease holds. */
  cost: z.number().int().positive(),
});
export type Lease = z.infer<typeof Lease>;

/** The opaque token of a lease (base64url of its fields). */
export function leaseToken(lease: Lease): string {
  const fields = [
    lease.region,
    lease.policy,
    lease.version,
    lease.subject,
    lease.stamp,
    lease.seq,
    lease.cost,
  ];
  return TOKEN_PREFIX + Buffer.from(JSON.stringify(fields), 'utf8').toString('base64url');
}

/** Read a token; a string that is not one the agent handed out is a reason, not an exception. */
export function parseLeaseToken(token: string): { ok: true; lease: Lease } | { ok: false; reason: string } {
  if (token.length > MAX_LEASE_TOKEN_LENGTH || !token.startsWith(TOKEN_PREFIX)) {
    return { ok: false, reason: 'not a lease token' };
  }
  const body = token.slice(TOKEN_PREFIX.length);
  if (!/^[A-Za-z0-9_-]+$/.test(body)) return { ok: false, reason: 'not a lease token' };
  let fields: unknown;
  try {
    fields = JSON.parse(Buffer.from(body, 'base64url').toString('utf8'));
  } catch {
    return { ok: false, reason: 'not a lease token' };
  }
  if (!Array.isArray(fields) || fields.length !== 7) return { ok: false, reason: 'not a lease token' };
  const [region, policy, version, subject, stamp, seq, cost] = fields as unknown[];
  const parsed = Lease.safeParse({ region, policy, version, subject, stamp, seq, cost });
  if (!parsed.success) return { ok: false, reason: 'not a lease token' };
  return { ok: true, lease: parsed.data };
}

/** The refund that releases a lease: exactly the entries its acquire wrote. */
export function leaseRelease(lease: Lease): LogRefund {
  return {
    keys: [slidingLogKey(lease.version, lease.subject, lease.policy)],
    entries: [{ stamp: lease.stamp, seq: lease.seq, cost: lease.cost }],
  };
}
