/**
 * A several-group request's claim of a plain record key (regional-agent/decisions/idempotency-claim.ts) against a
 * script that reads and writes that key, on a real Redis and on the script's model: what the Lua-vs-model tests of
 * each idempotent script (token bucket, sliding log, daily budget) run.
 */
import type { RecordClaim } from '../../core/idempotency-records.js';
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
}

const MARK = claimMark('0'.repeat(40));
const TTL_MS = 60_000;

/** The claim first, then the request: each step's answer from Redis and from the model. */
export async function markThenRequest<Req, Rep>(s: ClaimSubject<Req, Rep>) {
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
export async function requestThenMark<Req, Rep>(s: ClaimSubject<Req, Rep>) {
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
