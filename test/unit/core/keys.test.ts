import calculateSlot from 'cluster-key-slot';
import { describe, expect, it } from 'vitest';
import { bucketKey, hashTag, idempotencyRecordKey, idempotencyTtlMs } from '../../../core/keys.js';

describe('keys', () => {
  it('builds rl:v{version}:{subject}:{policy} with the subject as hash tag', () => {
    expect(bucketKey(3, 'tenant-42', 'writes')).toBe('rl:v3:{tenant-42}:writes');
    expect(hashTag(bucketKey(3, 'tenant-42', 'writes'))).toBe('tenant-42');
  });

  it('puts every bucket and idempotency record of one subject in one slot', () => {
    const keys = [
      bucketKey(1, 'tenant-42', 'writes'),
      bucketKey(2, 'tenant-42', 'reads'),
      idempotencyRecordKey('tenant-42', 'retry-abc'),
    ];
    expect(new Set(keys.map((k) => calculateSlot(k))).size).toBe(1);
    expect(calculateSlot(bucketKey(1, 'tenant-43', 'writes'))).not.toBe(calculateSlot(keys[0]!));
  });

  it('hashes the caller idempotency key to a fixed-length token', () => {
    const k = idempotencyRecordKey('t', 'x'.repeat(500));
    expect(k).toMatch(/^rl:idem:\{t\}:[A-Za-z0-9_-]{22}$/);
    expect(idempotencyRecordKey('t', 'a')).not.toBe(idempotencyRecordKey('t', 'b'));
  });
});

describe('idempotency records', () => {
  it('live no longer than the shortest idle TTL of the policies checked, nor than the configured bound', () => {
    expect(idempotencyTtlMs(3_600_000, [60])).toBe(60_000);
    expect(idempotencyTtlMs(3_600_000, [600, 45, 120])).toBe(45_000);
    expect(idempotencyTtlMs(30_000, [60])).toBe(30_000);
  });
});
