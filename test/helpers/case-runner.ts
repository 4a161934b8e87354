import type { DecideRequest } from '../../core/wire/bucket.js';
import { encodeRequest } from '../../core/wire/bucket.js';
import type { EncodedReply, EncodedRequest } from '../../core/models/token-bucket.js';
import { idempotencyRecordKey } from '../../core/keys.js';
import type { BucketCase, CaseStep } from '../cases/token-bucket-cases.js';

/** Virtual Redis time at which every case starts, in µs (a realistic epoch, so magnitudes match production). */
export const CASE_EPOCH_MICROS = 1_750_000_000_000_000;

/** One step as the script sees it, at its virtual instant. */
export interface PreparedStep {
  step: CaseStep;
  request: EncodedRequest;
  nowMicros: number;
}

/** Build the requests of a case, with keys under `prefix` (all in one hash-tag slot). */
export function prepareCase(prefix: string, c: BucketCase): PreparedStep[] {
  const out: PreparedStep[] = [];
  for (const step of c.steps) {
    const request: DecideRequest = {
      checks: step.checks.map((k) => ({
        key: `rl:v1:{${prefix}}:${k.bucket}`,
        capacity: k.capacity,
        refillPerSecond: k.refillPerSecond,
        cost: k.cost ?? 1,
        ttlMs: k.ttlMs ?? 3_600_000,
        floor:
          k.floor === undefined
            ? undefined
            : {
                beforeMicros: CASE_EPOCH_MICROS + Math.round(k.floor.beforeMs * 1000),
                refillPerSecond: k.floor.refillPerSecond,
                capacity: k.floor.capacity,
              },
        ...(k.mustExist === true ? { mustExist: true } : {}),
      })),
      dryRun: step.dryRun,
      idempotency:
        step.idempotencyKey === undefined
          ? undefined
          : {
              key: idempotencyRecordKey(prefix, step.idempotencyKey),
              ttlMs: 3_600_000,
              ...(step.maxRecords === undefined ? {} : { maxRecords: step.maxRecords }),
            },
    };
    const encoded = encodeRequest(request);
    const repeat = step.repeat ?? 1;
    for (let i = 0; i < repeat; i++) {
      // Expectations hold for the last repetition only.
      const checked = i === repeat - 1 ? step : { ...step, expect: undefined };
      out.push({
        step: checked,
        request: encoded,
        nowMicros: CASE_EPOCH_MICROS + Math.round(step.at * 1000),
      });
    }
  }
  return out;
}

/**
 * A list of mismatches and `same(what, want, got)` adding one when the JSON differs, with the outcome flags
 * (`allowed`, `replayed`, `conflict`) every case table expects already compared.
 */
export function mismatches(
  e: { allowed?: boolean; replayed?: boolean; conflict?: boolean },
  reply: { allowed: boolean; replayed: boolean; conflict: boolean },
): { problems: string[]; same: (what: string, want: unknown, got: unknown) => void } {
  const problems: string[] = [];
  const same = (what: string, want: unknown, got: unknown) => {
    if (JSON.stringify(want) !== JSON.stringify(got))
      problems.push(`${what}: want ${JSON.stringify(want)} got ${JSON.stringify(got)}`);
  };
  if (e.allowed !== undefined) same('allowed', e.allowed, reply.allowed);
  if (e.replayed !== undefined) same('replayed', e.replayed, reply.replayed);
  if (e.conflict !== undefined) same('conflict', e.conflict, reply.conflict);
  return { problems, same };
}

/** The expectations of a step, checked against a reply; returns a list of mismatches (empty when it holds). */
export function checkExpectations(step: CaseStep, reply: EncodedReply): string[] {
  const e = step.expect;
  if (e === undefined) return [];
  const { problems, same } = mismatches(e, reply);
  if (e.remaining !== undefined)
    same(
      'remaining',
      e.remaining,
      reply.results.map((r) => r.remaining / 1e6),
    );
  if (e.missing !== undefined) same('missing', e.missing, reply.missing ?? []);
  const orNull = (v: number) => (v < 0 ? null : v);
  if (e.retryAfterMs !== undefined)
    same(
      'retryAfterMs',
      e.retryAfterMs,
      reply.results.map((r) => orNull(r.retryAfterMs)),
    );
  if (e.resetMs !== undefined)
    same(
      'resetMs',
      e.resetMs,
      reply.results.map((r) => orNull(r.resetMs)),
    );
  return problems;
}
