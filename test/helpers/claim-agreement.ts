/**
 * A several-group request's claim of a plain record key (regional-agent/decisions/idempotency-claim.ts) against a
 * script that reads and writes that key, on a real Redis and on the script's model: what the Lua-vs-model tests of
 * each idempotent script (token bucket, sliding log, daily budget) run.
 */
import { describe, expect, it } from 'vitest';
import type { RecordClaim } from '../../core/models/idempotency.js';
import { claimMark } from '../../regional-agent/decisions/idempotency-claim.js';
import type { RedisDecisionStore } from '../../regional-agent/redis/decision-store.js';

export interface ClaimSubject<Req, Rep> {
  request: Req;
  /** The request's record key. */
  key: string;
  nowMicros: number;
  /** The script on Redis, decoded. */
  script: (request: Req, nowMicros: number) => Promise<Rep>;
  model: {
    evaluate(request: Req, nowMicros: number): Rep;
    claimRecord(key: string, value: string, ttlMs: number, now: number, peekOnly: boolean): RecordClaim;
  };
  claims: RedisDecisionStore;
  /** True when the request's counters were never written on Redis (the script charged nothing). */
  untouched: () => Promise<boolean>;
}

const MARK = claimMark('0'.repeat(40));
const TTL_MS = 60_000;

/** The claim first, then the request: each step's answer from Redis and from the model. */
async function markThenRequest<Req, Rep>(s: ClaimSubject<Req, Rep>) {
  const claimed = [
    await s.claims.claim(s.key, MARK, TTL_MS, false),
    s.model.claimRecord(s.key, MARK, TTL_MS, s.nowMicros, false),
  ];
  const decided = [await s.script(s.request, s.nowMicros), s.model.evaluate(s.request, s.nowMicros)];
  const again = [
    await s.claims.claim(s.key, MARK, TTL_MS, false),
    s.model.claimRecord(s.key, MARK, TTL_MS, s.nowMicros, false),
  ];
  return { claimed, decided, again };
}

/** The request first, then the claim (a look, then a write), then the request again. */
async function requestThenMark<Req, Rep>(s: ClaimSubject<Req, Rep>) {
  const decided = [await s.script(s.request, s.nowMicros), s.model.evaluate(s.request, s.nowMicros)];
  const claimed = [
    await s.claims.claim(s.key, MARK, TTL_MS, true),
    await s.claims.claim(s.key, MARK, TTL_MS, false),
    s.model.claimRecord(s.key, MARK, TTL_MS, s.nowMicros, true),
    s.model.claimRecord(s.key, MARK, TTL_MS, s.nowMicros, false),
  ];
  const retried = [await s.script(s.request, s.nowMicros), s.model.evaluate(s.request, s.nowMicros)];
  return { decided, claimed, retried };
}

/**
 * The claim against one script (`what`: its kind) on a real Redis and on its model, both orders: a one-group
 * request that finds the mark is a conflict charging nothing, and a claim that finds a record is a conflict that
 * leaves the record to replay.
 */
export function describeClaimAgreement<Req, Rep>(what: string, subject: () => ClaimSubject<Req, Rep>): void {
  describe(`a several-group claim on a ${what} record key: the script and the model agree`, () => {
    it(`a one-group ${what} request finds the mark: a conflict, charging nothing, in both`, async () => {
      const s = subject();
      const { claimed, decided, again } = await markThenRequest(s);
      expect(claimed).toEqual(['new', 'new']);
      expect(decided[0]).toEqual(decided[1]);
      expect(decided[0]).toMatchObject({ allowed: false, conflict: true });
      expect(await s.untouched()).toBe(true);
      expect(again).toEqual(['same', 'same']);
    });

    it(`the claim finds a one-group ${what} request’s record: a conflict in both, the record kept`, async () => {
      const { decided, claimed, retried } = await requestThenMark(subject());
      expect(decided[0]).toEqual(decided[1]);
      expect(decided[0]).toMatchObject({ allowed: true });
      expect(claimed).toEqual(['conflict', 'conflict', 'conflict', 'conflict']);
      expect(retried[0]).toEqual(retried[1]);
      expect(retried[0]).toMatchObject({ allowed: true, replayed: true });
    });
  });
}
