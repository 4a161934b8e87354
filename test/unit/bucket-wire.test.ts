import { describe, expect, it } from 'vitest';
import {
  InvalidBucketRequestError,
  decodeReply,
  encodeRequest,
  parseReply,
  scriptArguments,
} from '../../core/bucket-wire.js';

const check = { key: 'rl:v1:{s}:p', capacity: 10, refillPerSecond: 2, cost: 1, ttlMs: 60_000 };

describe('bucket wire format', () => {
  it('encodes tokens as micro-tokens: capacities round down, costs round up', () => {
    const e = encodeRequest({ checks: [{ ...check, capacity: 4.35, cost: 0.0000014 }] });
    expect(e.checks[0]).toMatchObject({ capacity: 4_350_000, cost: 2, rate: 2 });
    const shares = encodeRequest({ checks: [{ ...check, capacity: 100 / 3, cost: 1 }] });
    expect(shares.checks[0]!.capacity).toBe(33_333_333);
  });

  it('lays out KEYS and ARGV as the script header says', () => {
    const e = encodeRequest({
      checks: [
        check,
        { ...check, key: 'rl:v1:{s}:q', floor: { beforeMicros: 5, refillPerSecond: 1, capacity: 3 } },
      ],
      idempotency: { key: 'rl:idem:{s}:x', ttlMs: 1000 },
      dryRun: true,
    });
    expect(scriptArguments(e)).toEqual({
      keys: ['rl:v1:{s}:p', 'rl:v1:{s}:q', 'rl:idem:{s}:x'],
      argv: [
        '2',
        '1',
        '1000',
        '10000000',
        '2',
        '1000000',
        '60000',
        '0',
        '0',
        '0',
        '10000000',
        '2',
        '1000000',
        '60000',
        '5',
        '1',
        '3000000',
      ],
    });
  });

  it.each([
    [{ checks: [] }, 'checks: Too small: expected array to have >=1 items'],
    [{ checks: Array(17).fill(check) }, 'checks: Too big: expected array to have <=16 items'],
    [{ checks: [{ ...check, cost: 0 }] }, 'checks.0.cost: Too small: expected number to be >=0.000001'],
    [{ checks: [{ ...check, capacity: -1 }] }, 'checks.0.capacity: Too small: expected number to be >=0'],
    [{ checks: [{ ...check, ttlMs: 0.5 }] }, 'checks.0.ttlMs: Invalid input: expected int, received number'],
    [{ checks: [{ ...check, key: '' }] }, 'checks.0.key: Too small: expected string to have >=1 characters'],
    [
      { checks: [{ ...check, refillPerSecond: Number.NaN }] },
      'checks.0.refillPerSecond: Invalid input: expected number, received NaN',
    ],
  ])('refuses %j before any I/O', (request, message) => {
    let error: unknown;
    try {
      encodeRequest(request);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidBucketRequestError);
    expect((error as InvalidBucketRequestError).issues).toContain(message);
  });

  it('decodes a reply into tokens, with the overall retry-after the largest of the buckets', () => {
    const reply = parseReply([0, 0, 0, 3_500_000, 0, 3000, 0, 0, 2000, 5000], 2);
    expect(decodeReply(reply)).toEqual({
      allowed: false,
      replayed: false,
      retryAfterMs: 2000,
      results: [
        { allowed: false, remaining: 3.5, retryAfterMs: 0, resetMs: 3000 },
        { allowed: false, remaining: 0, retryAfterMs: 2000, resetMs: 5000 },
      ],
    });
  });

  it('says never when one bucket can never take the cost', () => {
    const reply = parseReply([0, 0, 0, 0, -1, -1, 0, 0, 2000, 5000], 2);
    expect(decodeReply(reply).retryAfterMs).toBeNull();
  });

  it('refuses a malformed reply', () => {
    expect(() => parseReply([1, 0, 1], 1)).toThrow(TypeError);
    expect(() => parseReply('OK', 1)).toThrow(TypeError);
  });
});
