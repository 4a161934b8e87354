/**
 * Reserve-then-commit: a consumer reserves `amount` before irreversible work (an ordinary decision that charges
 * it), then commits what it actually used; the rest is refunded. A reservation never committed or cancelled is
 * refunded whole when it expires. The reference model of `lua/reservation_create.lua` and
 * `lua/reservation_settle.lua`, their wire format, and the refunds a settlement makes.
 *
 * A reservation is a Redis hash `rl:resv:{id}` holding its state (`reserved`, then one of `committed`,
 * `cancelled`, `expired`, `aborted`), the amount reserved and committed (micro-units, integers), its expiry (µs of
 * Redis time) and what the decision charged (the `charges` body, opaque to the scripts). The state moves once, in
 * one script, so a commit, a cancel, the expiry sweep and an abort racing each other refund exactly once.
 *
 * An abort is the agent's own, when it cannot tell whether its create ran (the reply was lost or late): it settles
 * a reserved record as `aborted`, or, finding none, leaves a tombstone (a hash in state `aborted`, no body) that a
 * create arriving later refuses on (`QP_EXISTS`, nothing written). Either way the agent refunds the decision once;
 * a record settled otherwise first (the sweep expired it) is refunded by that settlement, not by the abort.
 */
import { z } from 'zod';
import { DecisionResponse } from '../wire/agent.js';
import { TokenCost } from '../wire/bucket.js';
import { ClassName, PolicyName, RegionName } from '../policy/names.js';
import type { DayRefund } from './daily-budget.js';
import type { LogRefund } from './sliding-log.js';
import type { RefundRequest } from './refund.js';

/** Micro-units per unit: amounts are kept as integers of this resolution (a token cost's). */
export const AMOUNT_MICRO = 1_000_000;
/** Longest reservation: one hour. */
export const MAX_RESERVATION_SECONDS = 3600;
/** Default reservation TTL. */
export const DEFAULT_RESERVATION_SECONDS = 300;
/** How long a settled reservation is kept so a repeated commit or cancel answers the same: one day. */
export const SETTLED_RETENTION_MS = 24 * 3600 * 1000;
/** Key of the index of reservations by expiry (ms of Redis time), swept by the agents of the region. */
export const RESERVATIONS_DUE_KEY = 'rl:resv:due';

/** What one check of an admitted decision charged in this region's store: what a refund gives back. */
export const Charge = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.literal('bucket'),
    policy: PolicyName,
    key: z.string().min(1).max(512),
    capacity: z.number().min(0),
    cost: z.number().positive(),
  }),
  z.strictObject({
    kind: z.literal('log'),
    policy: PolicyName,
    key: z.string().min(1).max(512),
    stamp: z.number().int().positive(),
    seq: z.number().int().min(0),
    cost: z.number().int().positive(),
  }),
  z.strictObject({
    kind: z.literal('day'),
    policy: PolicyName,
    key: z.string().min(1).max(512),
    /** µs start of the day charged. */
    start: z.number().int().positive(),
    cost: z.number().positive(),
  }),
]);
export type Charge = z.infer<typeof Charge>;

/** The record's body: the region, and what each check charged (checks decided by a failure mode charged nothing). */
export const ReservationBody = z.strictObject({
  region: RegionName,
  charges: z.array(Charge).max(16),
});
export type ReservationBody = z.infer<typeof ReservationBody>;

/** Redis key of a reservation. */
export function reservationKey(id: string): string {
  return `rl:resv:{${id}}`;
}

/** A reservation id: the region it lives in, a dot, 22 characters of randomness (base64url of 16 bytes). */
export const ReservationId = z
  .string()
  .max(64)
  .regex(/^[a-z][a-z0-9-]{0,31}\.[A-Za-z0-9_-]{22}$/, 'not a reservation id');

/** The region named by a valid id. */
export function regionOfReservation(id: string): string {
  return id.slice(0, id.indexOf('.'));
}

/** Units → micro-units, rounded as token costs are. */
export function toMicros(units: number): number {
  return Math.round(units * AMOUNT_MICRO);
}

/** A state a reservation leaves `reserved` for, once. */
export type SettledState = 'committed' | 'cancelled' | 'expired' | 'aborted';

/** How a settle call went (`lua/reservation_settle.lua`). */
export type SettleOutcome =
  /** This call moved the state: refund `reservedMicros - committedMicros` of every charge. */
  | {
      kind: 'settled';
      state: SettledState;
      reservedMicros: number;
      committedMicros: number;
      body: string;
    }
  /** A commit or cancel after the expiry: this call expired it (refund it whole), and the caller is told so. */
  | { kind: 'expired'; reservedMicros: number; body: string }
  /**
   * The same settlement again: nothing to do, the first answer stands (an abort again: the earlier abort's answer
   * was lost, so its caller never refunded and refunds now).
   */
  | {
      kind: 'replay';
      state: 'committed' | 'cancelled' | 'aborted';
      reservedMicros: number;
      committedMicros: number;
    }
  /** Settled otherwise before (committed with another amount, cancelled, expired, aborted). */
  | {
      kind: 'conflict';
      state: SettledState;
      reservedMicros: number;
      committedMicros: number;
    }
  /** A commit above what was reserved: nothing changed. */
  | { kind: 'above'; reservedMicros: number }
  /** The sweep asked before the expiry: nothing changed. */
  | { kind: 'not_due' }
  /** No such reservation (never made, or its record is gone). */
  | { kind: 'missing' }
  /** An abort found no record and left a tombstone: a late create writes nothing; refund what the decision charged. */
  | { kind: 'tombstoned' };

export type SettleAction = 'commit' | 'cancel' | 'expire' | 'abort';

/** ARGV of `lua/reservation_create.lua`. */
export function createArguments(body: ReservationBody, amountMicros: number, ttlMs: number): string[] {
  return [JSON.stringify(body), String(amountMicros), String(ttlMs), String(SETTLED_RETENTION_MS)];
}

/**
 * ARGV of `lua/reservation_settle.lua`. `micros` is the amount committed for a commit, the amount the decision
 * charged for an abort (what a tombstone records), else 0. `attempt` names the call, so that the same attempt
 * asked again after its answer was lost answers as the call that moved the state did.
 */
export function settleArguments(action: SettleAction, micros: number, attempt?: string): string[] {
  const argv = [action, String(micros), String(SETTLED_RETENTION_MS)];
  if (attempt !== undefined) argv.push(attempt);
  return argv;
}

const STATES = new Set<string>(['committed', 'cancelled', 'expired', 'aborted']);

/** Parse the settle script's reply; throws when its shape is not the documented one. */
export function parseSettleReply(reply: unknown): SettleOutcome {
  const bad = () => new TypeError(`unexpected reservation reply: ${JSON.stringify(reply)?.slice(0, 200)}`);
  if (!Array.isArray(reply) || !reply.every((v) => typeof v === 'string')) throw bad();
  const v = reply;
  const n = (i: number) => {
    const x = Number(v[i]);
    if (!Number.isSafeInteger(x) || x < 0) throw bad();
    return x;
  };
  const state = (i: number) => {
    if (!STATES.has(v[i] ?? '')) throw bad();
    return v[i] as SettledState;
  };
  switch (v[0]) {
    case 'settled':
      return {
        kind: 'settled',
        state: state(1),
        reservedMicros: n(2),
        committedMicros: n(3),
        body: v[4] ?? '',
      };
    case 'expired':
      return { kind: 'expired', reservedMicros: n(1), body: v[2] ?? '' };
    case 'replay': {
      const s = state(1);
      if (s === 'expired') throw bad();
      return { kind: 'replay', state: s, reservedMicros: n(2), committedMicros: n(3) };
    }
    case 'conflict':
      return { kind: 'conflict', state: state(1), reservedMicros: n(2), committedMicros: n(3) };
    case 'above':
      return { kind: 'above', reservedMicros: n(1) };
    case 'not_due':
      return { kind: 'not_due' };
    case 'missing':
      return { kind: 'missing' };
    case 'tombstoned':
      return { kind: 'tombstoned' };
    default:
      throw bad();
  }
}

/** One refund a settlement makes: a token bucket's (`lua/refund.lua`) or a log's entries (`lua/sliding_log_refund.lua`). */
export type SettlementRefund =
  | { kind: 'bucket'; request: RefundRequest }
  | { kind: 'log'; refund: LogRefund }
  | { kind: 'day'; refund: DayRefund };

/**
 * The refunds of a settlement: each charge gives back the part of the reservation not committed. A log gives back
 * its newest entries, whole ones only (the part of a unit committed keeps its entry: never more than was unused).
 */
export function settlementRefunds(
  body: ReservationBody,
  reservedMicros: number,
  committedMicros: number,
): SettlementRefund[] {
  const back = reservedMicros - committedMicros;
  if (back <= 0) return [];
  const out: SettlementRefund[] = [];
  for (const c of body.charges) {
    if (c.kind === 'bucket') {
      out.push({
        kind: 'bucket',
        request: { checks: [{ key: c.key, cost: back / AMOUNT_MICRO, capacity: c.capacity }] },
      });
      continue;
    }
    if (c.kind === 'day') {
      // A daily counter counts micro-units, as amounts are kept: the unused part exactly.
      out.push({ kind: 'day', refund: { keys: [c.key], entries: [{ start: c.start, cost: back }] } });
      continue;
    }
    const units = Math.min(c.cost, Math.floor(back / AMOUNT_MICRO));
    if (units === 0) continue;
    out.push({
      kind: 'log',
      refund: { keys: [c.key], entries: [{ stamp: c.stamp, seq: c.seq + (c.cost - units), cost: units }] },
    });
  }
  return out;
}

interface StoredReservation {
  state: 'reserved' | SettledState;
  body: string;
  reservedMicros: number;
  committedMicros: number;
  /** µs of (Redis) time. */
  expiresAt: number;
  /** µs at which the record itself is gone. */
  goneAt: number;
  /** The attempt that moved the state, when its caller named one. */
  by?: string | undefined;
}

/** An in-memory Redis for reservation records, step for step as the two scripts: the model they must agree with. */
export class ReservationModel {
  readonly #records = new Map<string, StoredReservation>();

  /**
   * `lua/reservation_create.lua` at `now` (µs): answers the expiry, µs. Throws `QP_EXISTS` (writing nothing) when
   * the key holds a record or a tombstone.
   */
  create(key: string, argv: readonly string[], now: number): number {
    const [body, amount, ttl, retention] = argv;
    if (this.#live(key, now) !== undefined) throw new Error('QP_EXISTS reservation exists');
    const expiresAt = now + Number(ttl) * 1000;
    this.#records.set(key, {
      state: 'reserved',
      body: body ?? '',
      reservedMicros: Number(amount),
      committedMicros: 0,
      expiresAt,
      goneAt: expiresAt + Number(retention) * 1000,
    });
    return expiresAt;
  }

  /** `lua/reservation_settle.lua` at `now` (µs). */
  settle(key: string, argv: readonly string[], now: number): SettleOutcome {
    const [action, amount, retention, attempt] = argv;
    const r = this.#live(key, now);
    if (r === undefined) {
      if (action !== 'abort') return { kind: 'missing' };
      this.#records.set(key, {
        state: 'aborted',
        body: '',
        reservedMicros: Number(amount),
        committedMicros: 0,
        expiresAt: 0,
        goneAt: now + Number(retention) * 1000,
      });
      return { kind: 'tombstoned' };
    }
    if (attempt !== undefined && r.state !== 'reserved' && r.by === attempt) {
      if (r.state === 'expired' && action !== 'expire')
        return { kind: 'expired', reservedMicros: r.reservedMicros, body: r.body };
      return {
        kind: 'settled',
        state: r.state,
        reservedMicros: r.reservedMicros,
        committedMicros: r.committedMicros,
        body: r.body,
      };
    }
    const keep = () => {
      r.goneAt = now + Number(retention) * 1000;
      if (r.state !== 'aborted' && attempt !== undefined) r.by = attempt;
    };
    if (r.state === 'reserved') {
      if (action === 'abort') {
        r.state = 'aborted';
        keep();
        return {
          kind: 'settled',
          state: 'aborted',
          reservedMicros: r.reservedMicros,
          committedMicros: 0,
          body: r.body,
        };
      }
      const expired = now >= r.expiresAt;
      if (action === 'expire' && !expired) return { kind: 'not_due' };
      if (expired) {
        r.state = 'expired';
        keep();
        if (action === 'expire') {
          return {
            kind: 'settled',
            state: 'expired',
            reservedMicros: r.reservedMicros,
            committedMicros: 0,
            body: r.body,
          };
        }
        return { kind: 'expired', reservedMicros: r.reservedMicros, body: r.body };
      }
      if (action === 'commit') {
        const committed = Number(amount);
        if (committed > r.reservedMicros) return { kind: 'above', reservedMicros: r.reservedMicros };
        r.state = 'committed';
        r.committedMicros = committed;
      } else {
        r.state = 'cancelled';
      }
      keep();
      return {
        kind: 'settled',
        state: r.state,
        reservedMicros: r.reservedMicros,
        committedMicros: r.committedMicros,
        body: r.body,
      };
    }
    const same =
      (r.state === 'committed' && action === 'commit' && Number(amount) === r.committedMicros) ||
      (r.state === 'cancelled' && action === 'cancel') ||
      (r.state === 'aborted' && action === 'abort');
    if (same && r.state !== 'expired') {
      return {
        kind: 'replay',
        state: r.state,
        reservedMicros: r.reservedMicros,
        committedMicros: r.committedMicros,
      };
    }
    return {
      kind: 'conflict',
      state: r.state,
      reservedMicros: r.reservedMicros,
      committedMicros: r.committedMicros,
    };
  }

  /** The record at `key` unless it is gone by `now` (dropped then, as Redis expires it). */
  #live(key: string, now: number): StoredReservation | undefined {
    const r = this.#records.get(key);
    if (r !== undefined && r.goneAt <= now) this.#records.delete(key);
    return r !== undefined && r.goneAt > now ? r : undefined;
  }
}

/** The wire: `POST /v1/reservations`. */
const ReserveCheck = z.strictObject({
  policy: z.string().min(1).max(64),
  subject: z.string().min(1).max(1024),
  /** The subject's class, as a decision's check names it (docs/subject-classes.md). */
  class: ClassName.optional(),
});
const ReserveCommon = {
  /** Units to reserve on every check (whole units when a check is a sliding log). */
  amount: TokenCost,
  /** Seconds before an uncommitted reservation is refunded whole (default 300, at most 3600). */
  ttlSeconds: z.number().int().min(1).max(MAX_RESERVATION_SECONDS).optional(),
};
export const ReservationRequest = z.union([
  z.strictObject({ ...ReserveCheck.shape, ...ReserveCommon }),
  z.strictObject({ checks: z.array(ReserveCheck).min(1).max(16), ...ReserveCommon }),
]);
export type ReservationRequest = z.infer<typeof ReservationRequest>;

/** `POST /v1/reservations/{id}/commit`. */
export const CommitRequest = z.strictObject({
  /** Units actually used, 0..amount reserved; the rest is refunded. */
  amount: z.number().min(0).max(1e9),
});
export type CommitRequest = z.infer<typeof CommitRequest>;

/** Path of the reservation routes. */
export const ReservationParams = z.strictObject({ id: z.string().min(1).max(64) });

/** The answer of a commit or a cancel (the same answer for a repeat of the same settlement). */
export const SettlementResponse = z.object({
  id: z.string(),
  state: z.enum(['committed', 'cancelled']),
  reserved: z.number().min(0),
  committed: z.number().min(0),
  /** Units given back to every check (reserved - committed). */
  refunded: z.number().min(0),
  /** True when an earlier call made this settlement; this one changed nothing. */
  replayed: z.boolean(),
});
export type SettlementResponse = z.infer<typeof SettlementResponse>;

/**
 * The answer of `POST /v1/reservations`: the decision (always 200, as `POST /v1/decisions`), and when it admitted,
 * the reservation to commit or cancel.
 */
export const ReservationResponse = DecisionResponse.extend({
  reservation: z
    .object({
      id: z.string(),
      amount: z.number().positive(),
      /** Ms until an uncommitted reservation is refunded whole. */
      expiresInMs: z.number().int().min(0),
    })
    .optional(),
});
export type ReservationResponse = z.infer<typeof ReservationResponse>;
