/**
 * The agent's share history per unit (a policy's default vector, or one subject's override), for refill floors:
 * buckets last written before the latest change of a unit's share refill at most at the lowest share in force
 * within the policy's idle TTL, so a share that dipped and rose again mints nothing.
 */
import type { RegionalShare } from '../shares/shares.js';

const SEP = '\u0000';

/** The key of a unit: the policy for its default vector, policy and subject for an override. */
export function unitKey(policy: string, subject?: string): string {
  return subject === undefined || subject === '' ? policy : policy + SEP + subject;
}

/** The policy and subject (undefined: the default vector) of a unit key. */
export function splitUnitKey(key: string): [policy: string, subject: string | undefined] {
  return key.split(SEP) as [string, string | undefined];
}

/** The unit keys of `policy`'s overrides start with this. */
export function overridePrefix(policy: string): string {
  return policy + SEP;
}

interface History {
  /** (time, in-force share) points, oldest first, pruned to the policy's idle TTL. */
  points: { at: number; share: number }[];
}

export class ShareHistory {
  readonly #skewMs: number;
  readonly #units = new Map<string, History>();

  /** `skewMs`: margin added to cut-offs for the offset between this clock and Redis time. */
  constructor(skewMs: number) {
    this.#skewMs = skewMs;
  }

  /** The share in force of one unit from `at` on (a point only when it changed). */
  push(key: string, share: number, at: number, idleTtlSeconds: number): void {
    const h = this.#units.get(key);
    if (h === undefined) {
      this.#units.set(key, { points: [{ at, share }] });
      return;
    }
    const last = h.points[h.points.length - 1];
    if (last !== undefined && last.share === share) return;
    h.points.push({ at, share });
    // Keep one point older than the window: the share in force at its start.
    const horizon = at - idleTtlSeconds * 1000 - this.#skewMs;
    while (h.points.length > 2 && h.points[1]!.at <= horizon) h.points.shift();
  }

  /** The unit is gone. */
  delete(key: string): void {
    this.#units.delete(key);
  }

  /**
   * The refill floor for buckets of one unit. Only a bucket last written before the latest *decrease* of the
   * share can have an idle interval in which the share dipped below the rate stored with it: after that
   * decrease the share only rose, and the script already refills at most at the stored rate. Such a bucket
   * refills at most at the lowest share in force within the idle TTL. A decrease older than the idle TTL
   * needs no floor: every bucket written before it has expired.
   */
  floor(key: string, share: number, windowMs: number, now: number): RegionalShare['floor'] {
    const h = this.#units.get(key);
    if (h === undefined || h.points.length < 2) return undefined;
    const horizon = now - windowMs - this.#skewMs;
    let lastDecrease: number | undefined;
    for (let i = h.points.length - 1; i > 0; i--) {
      if (h.points[i]!.share < h.points[i - 1]!.share) {
        lastDecrease = h.points[i]!.at;
        break;
      }
    }
    if (lastDecrease === undefined || lastDecrease <= horizon) return undefined;
    const lowest = this.lowest(key, share, windowMs, now);
    if (lowest >= share) return undefined;
    return { sinceMs: lastDecrease + this.#skewMs, share: lowest };
  }

  /** The lowest share of one unit in force within the last `windowMs` (plus skew), `share` included. */
  lowest(key: string, share: number, windowMs: number, now: number): number {
    const h = this.#units.get(key);
    if (h === undefined) return share;
    const horizon = now - windowMs - this.#skewMs;
    let lowest = share;
    for (let i = 0; i < h.points.length; i++) {
      const next = h.points[i + 1];
      if (next !== undefined && next.at <= horizon) continue; // wholly before the window
      lowest = Math.min(lowest, h.points[i]!.share);
    }
    return lowest;
  }
}
