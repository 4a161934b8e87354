import { describe, expect, it } from 'vitest';
import { createHmac } from 'node:crypto';
import { leaseKeyFrom, leaseRelease, leaseToken, parseLeaseToken } from '../../../core/concurrency.js';
import { MAX_LOG_LIMIT, parsePolicy, PolicySpec } from '../../../core/policy/policy.js';
import { SlidingLogModel, type LogRefund } from '../../../core/models/sliding-log.js';
import {
  checkAcquire,
  concurrencyCases,
  prepareConcurrencyCase,
  rememberLease,
} from '../../cases/concurrency-cases.js';
import { LOG_CASE_EPOCH_MICROS } from '../../cases/sliding-log-cases.js';

describe('concurrency model: the case table', () => {
  for (const c of concurrencyCases) {
    it(c.name, () => {
      const model = new SlidingLogModel();
      const leases = new Map<string, LogRefund>();
      const problems: string[] = [];
      prepareConcurrencyCase('p', c).forEach((s, i) => {
        if ('release' in s) {
          const now = LOG_CASE_EPOCH_MICROS + Math.round(s.step.at * 1000);
          const { removed } = model.refund(s.release(leases), now);
          if (s.step.expect !== undefined && removed[0] !== s.step.expect.removed)
            problems.push(`step ${i}: removed want ${s.step.expect.removed} got ${removed[0]}`);
          return;
        }
        const reply = model.evaluate(s.request, s.nowMicros);
        rememberLease(leases, s.step, s.request, reply);
        for (const p of checkAcquire(s.step, reply)) problems.push(`step ${i} (at ${s.step.at}): ${p}`);
      });
      expect(problems).toEqual([]);
    });
  }
});

describe('concurrency policies: the schema', () => {
  it('derives the rate and idle TTL from the lease; whole slots only', () => {
    expect(parsePolicy({ name: 'c', kind: 'concurrency', capacity: 10, leaseSeconds: 120 })).toMatchObject({
      kind: 'concurrency',
      refillPerSecond: 10 / 120,
      idleTtlSeconds: 120,
      maxCost: 1,
      leaseSeconds: 120,
    });
  });

  it('refuses what a concurrency policy cannot mean, listing every problem', () => {
    const r = PolicySpec.safeParse({
      kind: 'concurrency',
      capacity: 2.5,
      maxCost: 1.5,
      refillPerSecond: 3,
      onStoreFailure: 'local',
      mode: 'strict',
      homeRegion: 'us',
      leaseSeconds: 60,
      windowSeconds: 60,
    });
    expect(r.success).toBe(false);
    expect(r.error?.issues.map((i) => i.path.join('.')).sort()).toEqual([
      'capacity',
      'maxCost',
      'mode',
      'onStoreFailure',
      'refillPerSecond',
      'windowSeconds',
    ]);
    expect(PolicySpec.safeParse({ kind: 'concurrency', capacity: 3 }).error?.issues[0]?.path).toEqual([
      'leaseSeconds',
    ]);
    expect(
      PolicySpec.safeParse({ capacity: 3, refillPerSecond: 1, leaseSeconds: 5 }).error?.issues[0]?.path,
    ).toEqual(['leaseSeconds']);
    expect(PolicySpec.safeParse({ kind: 'concurrency', capacity: 3, leaseSeconds: 3601 }).success).toBe(
      false,
    );
  });
});

describe('lease tokens', () => {
  const key = 'a lease key of the region, 32 chars';
  const lease = {
    region: 'us',
    policy: 'exports',
    version: 3,
    subject: 'tenant:42',
    stamp: 1_750_000_000_000_123,
    seq: 7,
    cost: 2,
  };
  /** A token with the given fields, signed with `with` (the region's key unless told). */
  const signed = (fields: unknown[], withKey: string = key): string => {
    const body = Buffer.from(JSON.stringify(fields)).toString('base64url');
    return `l2.${body}.${createHmac('sha256', withKey).update('l2.').update(body).digest('base64url')}`;
  };

  it('round-trip and name the entries to remove', () => {
    const token = leaseToken(lease, key);
    expect(token).toMatch(/^l2\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
    expect(parseLeaseToken(token, key)).toEqual({ ok: true, lease });
    expect(leaseRelease(lease)).toEqual({
      keys: ['rl:log:v3:{tenant:42}:exports'],
      entries: [{ stamp: lease.stamp, seq: 7, cost: 2 }],
    });
  });

  it('a raised count, another subject, a truncated MAC or another key is not a lease', () => {
    const token = leaseToken(lease, key);
    const [body = '', tag = ''] = token.slice(3).split('.');
    const fields = ['us', 'exports', 3, 'tenant:42', lease.stamp, 7, 2];
    const forged = [
      // The fields of a real lease with the count raised, re-encoded with the old MAC.
      `l2.${Buffer.from(JSON.stringify(['us', 'exports', 3, 'tenant:42', lease.stamp, 7, 9e15])).toString('base64url')}.${tag}`,
      // Another holder's entries under this lease's MAC.
      `l2.${Buffer.from(JSON.stringify(['us', 'exports', 3, 'tenant:7', lease.stamp, 7, 2])).toString('base64url')}.${tag}`,
      `l2.${body}.${tag.slice(0, 42)}`,
      `l2.${body}.`,
      `l2.${body}`,
      signed(fields, 'another region key of 32 chars!!'),
      // The unsigned format this replaced.
      `l1.${body}`,
    ];
    for (const t of forged) expect(parseLeaseToken(t, key), t).toMatchObject({ ok: false });
  });

  it('a signed token is still bounded: a count above MAX_LOG_LIMIT or a stamp beyond 2^53 is refused', () => {
    const bad = [
      signed(['us', 'exports', 3, 'tenant:42', 1, 0, MAX_LOG_LIMIT + 1]),
      signed(['us', 'exports', 3, 'tenant:42', 1, 0, 9e15]),
      signed(['us', 'exports', 3, 'tenant:42', 2 ** 53, 0, 1]),
      signed(['us', 'exports', 3, 'tenant:42', 1, -1, 1]),
      signed(['us', 'exports', 3, 'tenant:42', 1, 0, 0]),
      signed(['us', 'exports', 3, 'tenant:42', 1, 0, 1.5]),
    ];
    for (const t of bad) expect(parseLeaseToken(t, key).ok, t).toBe(false);
    expect(parseLeaseToken(signed(['us', 'exports', 3, 'tenant:42', 1, 0, MAX_LOG_LIMIT]), key).ok).toBe(
      true,
    );
  });

  it('anything else is not a lease', () => {
    const bad = [
      '',
      'x',
      'l2.',
      'l2.!!',
      signed([]),
      signed(['us', 'exports', 3, 'tenant:42', 1, 0, 0]),
      signed(['US', 'exports', 3, 'tenant:42', 1, 0, 1]),
      `l2.${'A'.repeat(600)}`,
    ];
    for (const t of bad) expect(parseLeaseToken(t, key).ok, t).toBe(false);
  });

  it('the key: leaseTokenSecret, else one derived from hmacSecret, else the fallback', () => {
    const fallback = new Uint8Array(32).fill(7);
    expect(leaseKeyFrom({ leaseTokenSecret: key, hmacSecret: 'x'.repeat(16) }, () => fallback)).toBe(key);
    const derived = leaseKeyFrom({ hmacSecret: 'x'.repeat(16) }, () => fallback);
    expect(derived).toEqual(leaseKeyFrom({ hmacSecret: 'x'.repeat(16) }, () => fallback));
    expect(Buffer.from(derived).equals(Buffer.from('x'.repeat(16)))).toBe(false);
    expect(leaseKeyFrom({}, () => fallback)).toBe(fallback);
  });
});
