import { describe, expect, it } from 'vitest';
import { leaseRelease, leaseToken, parseLeaseToken } from '../../core/concurrency.js';
import { parsePolicy, PolicySpec } from '../../core/policy.js';
import { SlidingLogModel, type LogRefund } from '../../core/sliding-log.js';
import {
  checkAcquire,
  concurrencyCases,
  prepareConcurrencyCase,
  rememberLease,
} from '../cases/concurrency-cases.js';
import { LOG_CASE_EPOCH_MICROS } from '../cases/sliding-log-cases.js';

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
  const lease = {
    region: 'us',
    policy: 'exports',
    version: 3,
    subject: 'tenant:42',
    stamp: 1_750_000_000_000_123,
    seq: 7,
    cost: 2,
  };

  it('round-trip and name the entries to remove', () => {
    const token = leaseToken(lease);
    expect(token).toMatch(/^l1\.[A-Za-z0-9_-]+$/);
    expect(parseLeaseToken(token)).toEqual({ ok: true, lease });
    expect(leaseRelease(lease)).toEqual({
      keys: ['rl:log:v3:{tenant:42}:exports'],
      entries: [{ stamp: lease.stamp, seq: 7, cost: 2 }],
    });
  });

  it('anything else is not a lease', () => {
    const bad = [
      '',
      'x',
      'l1.',
      'l1.!!',
      `l1.${Buffer.from('{}').toString('base64url')}`,
      `l1.${Buffer.from(JSON.stringify(['us', 'exports', 3, 'tenant:42', 1, 0, 0])).toString('base64url')}`,
      `l1.${Buffer.from(JSON.stringify(['US', 'exports', 3, 'tenant:42', 1, 0, 1])).toString('base64url')}`,
      `l1.${'A'.repeat(600)}`,
    ];
    for (const t of bad) expect(parseLeaseToken(t).ok, t).toBe(false);
  });
});
