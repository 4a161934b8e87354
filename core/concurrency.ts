/**
 * Concurrency leases: a `concurrency` policy is a sliding log whose window is the lease TTL (core/models/sliding-log.ts,
 * `lua/sliding_log.lua`): acquiring a slot writes one entry per unit of cost, stamped with Redis time; the slot is
 * held while the entry is in the window (`leaseSeconds`) and comes back when it is released
 * (`lua/sliding_log_refund.lua` removes exactly the entries the acquire wrote) or when the lease runs out, so a
 * crashed holder never keeps a slot longer than its lease.
 *
 * A lease is named by a token the agent hands back with the decision: it says which region's store, which log
 * (policy, version, normalized subject) and which entries (stamp, first sequence number, cost) to remove, and it
 * carries an HMAC-SHA256 of those fields under the region's lease key (`leaseTokenSecret`), so a caller can
 * neither forge a token, nor raise its count, nor point it at another holder's entries: a release removes what
 * its acquire wrote and nothing else. Every field is bounded (cost ≤ MAX_LOG_LIMIT) before any script runs.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { z } from 'zod';
import { MAX_LOG_LIMIT, PolicyName, RegionName } from './policy/policy.js';
import { slidingLogKey, type LogRefund } from './models/sliding-log.js';

/** Prefix of every lease token; a future format gets another (`l1.` tokens carried no MAC and are refused). */
const TOKEN_PREFIX = 'l2.';
/** Longest token accepted: a normalized subject is at most 96 characters (hashed ones are shorter). */
export const MAX_LEASE_TOKEN_LENGTH = 512;
/** The key lease tokens are signed with: the same for every agent of a region, so any of them releases. */
export type LeaseKey = string | Uint8Array;

/** What a lease token names. */
export const Lease = z.strictObject({
  region: RegionName,
  policy: PolicyName,
  version: z.number().int().positive(),
  /** The normalized (or hashed) subject, as the log key holds it. */
  subject: z.string().min(1).max(128),
  /** µs of Redis time the entries were stamped with (their score). */
  stamp: z.number().int().positive().max(Number.MAX_SAFE_INTEGER),
  /** Sequence number of the first entry. */
  seq: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  /** Slots the lease holds: never more than a log may hold. */
  cost: z.number().int().positive().max(MAX_LOG_LIMIT),
});
export type Lease = z.infer<typeof Lease>;

function mac(key: LeaseKey, body: string): Buffer {
  return createHmac('sha256', key).update(TOKEN_PREFIX).update(body).digest();
}

/** The token of a lease: base64url of its fields, then `.` and the base64url HMAC of prefix and body. */
export function leaseToken(lease: Lease, key: LeaseKey): string {
  const fields = [
    lease.region,
    lease.policy,
    lease.version,
    lease.subject,
    lease.stamp,
    lease.seq,
    lease.cost,
  ];
  const body = Buffer.from(JSON.stringify(fields), 'utf8').toString('base64url');
  return `${TOKEN_PREFIX}${body}.${mac(key, body).toString('base64url')}`;
}

/** What reading a token found: the lease, or why not (with the region it claims, when it claims one). */
export type LeaseParse = { ok: true; lease: Lease } | { ok: false; reason: string; region?: string };

/** The fields of a token body, or undefined when it is not a JSON array of 7. */
function decodeFields(body: string): unknown[] | undefined {
  try {
    const fields: unknown = JSON.parse(Buffer.from(body, 'base64url').toString('utf8'));
    return Array.isArray(fields) && fields.length === 7 ? (fields as unknown[]) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Read a token; a string that is not one an agent of this region handed out (any other text, a changed field, a
 * cut-off MAC, another key) is a reason, not an exception. A token whose MAC fails says the region it claims, so
 * one of another region (signed with that region's key) is answered as misdirected rather than as a forgery.
 */
export function parseLeaseToken(token: string, key: LeaseKey): LeaseParse {
  if (token.length > MAX_LEASE_TOKEN_LENGTH || !token.startsWith(TOKEN_PREFIX)) {
    return { ok: false, reason: 'not a lease token' };
  }
  const match = /^([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{43})$/.exec(token.slice(TOKEN_PREFIX.length));
  if (match === null) return { ok: false, reason: 'not a lease token' };
  const [, body = '', sent = ''] = match;
  const fields = decodeFields(body);
  if (fields === undefined) return { ok: false, reason: 'not a lease token' };
  const expected = mac(key, body);
  const given = Buffer.from(sent, 'base64url');
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
    const claimed = RegionName.safeParse(fields[0]);
    return {
      ok: false,
      reason: 'not a lease token an agent of this region issued',
      ...(claimed.success ? { region: claimed.data } : {}),
    };
  }
  const [region, policy, version, subject, stamp, seq, cost] = fields;
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

/**
 * The key a region's agents sign lease tokens with: `leaseTokenSecret` when set; else one derived from
 * `hmacSecret` (the same in every agent of a deployment); else `fallback` (random per process: a lease is then
 * released only through the agent that acquired it, and otherwise runs out on its own).
 */
export function leaseKeyFrom(
  secrets: { leaseTokenSecret?: string | undefined; hmacSecret?: string | undefined },
  fallback: () => Uint8Array,
): LeaseKey {
  if (secrets.leaseTokenSecret !== undefined) return secrets.leaseTokenSecret;
  if (secrets.hmacSecret !== undefined) {
    return createHmac('sha256', secrets.hmacSecret).update('quotaplane lease tokens').digest();
  }
  return fallback();
}
