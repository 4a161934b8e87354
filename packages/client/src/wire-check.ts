/**
 * The hot path's check of a decision answer: a hand-written structural test of what `DecisionResponse` (zod)
 * accepts, without zod's cost (a few µs per answer, paid for every protected request), and of a batch answer
 * (`BatchResponse`). It accepts only answers zod would accept too; anything it does not accept is handed to zod,
 * which then accepts it or says why not, so the client's verdict on every answer is zod's.
 */
import { DecisionReason, DegradedCause, Problem, type DecisionResponse } from '../../../core/wire/agent.js';
import type { BatchAnswer } from '../../../core/wire/batch.js';
import { hasOwnKey } from '../../../core/own-keys.js';
import { PolicyMode } from '../../../core/policy/names.js';

const REASONS: ReadonlySet<string> = new Set(DecisionReason.options);
const CAUSES: ReadonlySet<string> = new Set(DegradedCause.options);
const MODES: ReadonlySet<string> = new Set(PolicyMode.options);

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isWait(v: unknown): boolean {
  return v === null || (typeof v === 'number' && v >= 0);
}

function isCount(v: unknown): boolean {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

function isResult(r: unknown): boolean {
  if (!isObject(r)) return false;
  return (
    typeof r['policy'] === 'string' &&
    typeof r['allowed'] === 'boolean' &&
    isCount(r['remaining']) &&
    isCount(r['limit']) &&
    isWait(r['resetMs']) &&
    isWait(r['retryAfterMs']) &&
    typeof r['mode'] === 'string' &&
    MODES.has(r['mode']) &&
    (r['reason'] === undefined || (typeof r['reason'] === 'string' && REASONS.has(r['reason']))) &&
    (r['cause'] === undefined || (typeof r['cause'] === 'string' && CAUSES.has(r['cause']))) &&
    (r['lease'] === undefined || typeof r['lease'] === 'string')
  );
}

/**
 * `json` as a decision when it surely is one (what zod would accept, unknown keys aside: zod would strip them),
 * else undefined (ask zod). A `__proto__` header is left to zod, which drops it.
 */
export function fastDecision(json: unknown): DecisionResponse | undefined {
  if (!isObject(json)) return undefined;
  if (typeof json['allowed'] !== 'boolean' || !isWait(json['retryAfterMs'])) return undefined;
  if (json['replayed'] !== undefined && typeof json['replayed'] !== 'boolean') return undefined;
  const results = json['results'];
  if (!Array.isArray(results)) return undefined;
  for (const r of results) if (!isResult(r)) return undefined;
  const headers = json['headers'];
  if (!isObject(headers) || hasOwnKey(headers, '__proto__')) return undefined;
  for (const v of Object.values(headers)) if (typeof v !== 'string') return undefined;
  return json as unknown as DecisionResponse;
}

/**
 * A batch answer's `n` elements when it surely is one whose every decision passes `fastDecision` (what zod's
 * `BatchResponse` would accept, unknown keys aside), else undefined (ask zod). A problem element's body is checked
 * by zod's `Problem` (problems are rare), its `retryAfter` (whole seconds, at least 1) by hand.
 */
export function fastAnswers(json: unknown, n: number): BatchAnswer[] | undefined {
  if (!isObject(json)) return undefined;
  const answers = json['answers'];
  if (!Array.isArray(answers) || answers.length !== n) return undefined;
  for (const a of answers as unknown[]) {
    if (!isObject(a)) return undefined;
    const { status, body, retryAfter } = a;
    if (status === 200) {
      if (fastDecision(body) === undefined) return undefined;
    } else if (
      !(typeof status === 'number' && Number.isInteger(status) && status >= 400 && status <= 599) ||
      !(retryAfter === undefined || (Number.isInteger(retryAfter) && (retryAfter as number) >= 1)) ||
      !Problem.safeParse(body).success
    )
      return undefined;
  }
  return answers as BatchAnswer[];
}
