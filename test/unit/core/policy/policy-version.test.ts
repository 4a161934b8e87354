import { describe, expect, it } from 'vitest';
import { parsePolicy, type PolicyInput } from '../../../../core/policy/policy.js';
import { nextVersion, unitChanges } from '../../../../core/policy/policy-version.js';

const p = (fields: Omit<PolicyInput, 'name'>) => parsePolicy({ name: 'p', ...fields });
const bucket = { capacity: 10, refillPerSecond: 1 } as const;
const log = { kind: 'sliding_log', capacity: 10, windowSeconds: 60 } as const;

describe('policy units', () => {
  it('a budget change is not a units change', () => {
    expect(unitChanges(p(bucket), p({ ...bucket, capacity: 50, refillPerSecond: 5, maxCost: 2 }))).toEqual(
      [],
    );
    expect(unitChanges(p(log), p({ ...log, capacity: 99 }))).toEqual([]);
    expect(unitChanges(p(bucket), p({ ...bucket, mode: 'strict', homeRegion: 'us' }))).toEqual([]);
  });

  it('kind, window, lease, zone, shards and what a subject is are units', () => {
    expect(unitChanges(p(bucket), p(log))).toEqual(['kind', 'windowSeconds']);
    expect(unitChanges(p(log), p({ ...log, windowSeconds: 600 }))).toEqual(['windowSeconds']);
    const lease = { kind: 'concurrency', capacity: 3, leaseSeconds: 30 } as const;
    expect(unitChanges(p(lease), p({ ...lease, leaseSeconds: 60 }))).toEqual(['leaseSeconds']);
    const day = { kind: 'daily', capacity: 100 } as const;
    expect(unitChanges(p(day), p({ ...day, timeZone: 'Europe/Paris' }))).toEqual(['timeZone']);
    expect(unitChanges(p(day), p({ ...day, timeZone: 'UTC' }))).toEqual([]);
    expect(unitChanges(p(bucket), p({ ...bucket, shards: 4 }))).toEqual(['shards']);
    expect(unitChanges(p(bucket), p({ ...bucket, subjectKind: 'ip' }))).toEqual([
      'subjectKind',
      'ipv4Prefix',
      'ipv6Prefix',
    ]);
    const ip = { ...bucket, subjectKind: 'ip' } as const;
    expect(unitChanges(p(ip), p({ ...ip, ipv4Prefix: 24 }))).toEqual(['ipv4Prefix']);
    // The default prefix written out is the same unit.
    expect(unitChanges(p(ip), p({ ...ip, ipv4Prefix: 32, ipv6Prefix: 64 }))).toEqual([]);
  });
});

describe('nextVersion', () => {
  it('a create stores the version asked for', () => {
    expect(nextVersion(undefined, p({ ...bucket, version: 7 }))).toEqual({ version: 7 });
  });

  it('a units change moves to the next version, or to a higher one asked for', () => {
    expect(nextVersion(p({ ...log, version: 3 }), p({ ...log, windowSeconds: 600 }))).toEqual({
      version: 4,
      bump: { from: 3, to: 4, fields: ['windowSeconds'] },
    });
    expect(
      nextVersion(p({ ...log, version: 3 }), p({ ...log, windowSeconds: 600, version: 3 })).version,
    ).toBe(4);
    expect(nextVersion(p({ ...log, version: 3 }), p({ ...log, windowSeconds: 600, version: 9 }))).toEqual({
      version: 9,
      bump: { from: 3, to: 9, fields: ['windowSeconds'] },
    });
  });

  it('the version never goes down, and an operator may still raise it alone', () => {
    expect(nextVersion(p({ ...bucket, version: 5 }), p({ ...bucket, capacity: 20 }))).toEqual({
      version: 5,
    });
    expect(nextVersion(p({ ...bucket, version: 5 }), p({ ...bucket, version: 2 }))).toEqual({ version: 5 });
    expect(nextVersion(p({ ...bucket, version: 5 }), p({ ...bucket, version: 6 }))).toEqual({ version: 6 });
  });
});
