/**
 * The wire of `lua/refund.lua` in script units (micro-tokens): its arguments and its reply, with no model and no
 * validation (core/models/refund.ts has both), so that a client handing back tokens it took ahead
 * (packages/client/src/direct.ts) carries no more than it needs.
 */
import { integerReply } from './script.js';

/** One bucket's refund, in script units. */
export interface EncodedRefundResult {
  /** Micro-tokens given back (0 when the key is gone or the bucket was already full). */
  refunded: number;
  /** Micro-tokens held after the refund; -1 when the key is gone. */
  tokens: number;
}

/** What a refund call answers, in script units. */
export interface EncodedRefundReply {
  results: EncodedRefundResult[];
  /** True when the idempotency record existed and was deleted. */
  recordDeleted: boolean;
  /** The refund ran past its deadline and changed nothing (`results` is empty). */
  late?: true;
}

/** A refund in script units. */
export interface EncodedRefund {
  keys: string[];
  checks: { cost: number; capacity: number }[];
  recordKey?: string | undefined;
  /** µs of Redis TIME after which the refund changes nothing. */
  deadline?: number | undefined;
}

/** KEYS and ARGV of `lua/refund.lua`. */
export function refundArguments(refund: EncodedRefund): { keys: string[]; argv: string[] } {
  const keys = refund.recordKey === undefined ? [...refund.keys] : [...refund.keys, refund.recordKey];
  const argv = [String(refund.checks.length), refund.recordKey === undefined ? '0' : '1'];
  for (const c of refund.checks) argv.push(String(c.cost), String(c.capacity));
  if (refund.deadline !== undefined) argv.push(String(refund.deadline));
  return { keys, argv };
}

/** Parse the script's reply for `checks` buckets; throws when its shape is not the documented one. */
export function parseRefundReply(reply: unknown, checks: number): EncodedRefundReply {
  if (Array.isArray(reply) && reply.length === 1 && reply[0] === -1)
    return { results: [], recordDeleted: false, late: true };
  const values = integerReply(reply, 2 * checks + 1, 'refund reply');
  const results: EncodedRefundResult[] = [];
  for (let i = 0; i < checks; i++) results.push({ refunded: values[2 * i]!, tokens: values[2 * i + 1]! });
  return { results, recordDeleted: values[2 * checks] === 1 };
}
