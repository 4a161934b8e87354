import { validateKey } from '@nats-io/kv/internal';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { AuditQuery, BudgetPatch, PolicyBody, PolicyView } from '../../../../core/wire/admin.js';
import { Policy } from '../../../../core/policy/policy.js';
import { auditSubject, kvNames, policyKey, policyNameFromKey } from '../../../../core/wire/kv.js';
import { canonicalSpec, policyBodyFor } from '../../../../coordinator/policies/validate.js';

const policyName = fc.stringMatching(/^[a-z0-9][a-z0-9_.-]{0,63}$/);

describe('KV names and keys', () => {
  it('derives every name from the namespace', () => {
    expect(kvNames()).toEqual({
      policies: 'qp-policies',
      allocations: 'qp-allocations',
      agents: 'qp-agents',
      demand: 'qp-demand',
      leader: 'qp-leader',
      auditStream: 'qp-audit',
      auditSubjectPrefix: 'qp.audit',
    });
    expect(kvNames('prod-eu').policies).toBe('prod-eu-policies');
    expect(() => kvNames('Prod')).toThrow();
    expect(auditSubject(kvNames(), 'a.b')).toBe('qp.audit.a=b');
  });

  it('maps every policy name to a valid single-token KV key and back', () => {
    fc.assert(
      fc.property(policyName, (name) => {
        const key = policyKey(name);
        expect(() => validateKey(key)).not.toThrow();
        expect(key).not.toContain('.');
        expect(policyNameFromKey(key)).toBe(name);
      }),
    );
    expect(policyKey('a..b.')).toBe('a==b=');
  });

  it('refuses keys no policy name maps to', () => {
    for (const key of ['UPPER', 'a.b', '', '-lead', 'x'.repeat(65), 'a b']) {
      expect(policyNameFromKey(key), key).toBeUndefined();
    }
  });
});

describe('admin wire schemas', () => {
  const body = fc.record(
    {
      capacity: fc.double({ min: 1, max: 1e6, noNaN: true }),
      refillPerSecond: fc.double({ min: 0.01, max: 1e6, noNaN: true }),
      mode: fc.constantFrom('regional' as const, 'local' as const),
      onStoreFailure: fc.constantFrom('closed' as const, 'open' as const, 'local' as const),
      version: fc.integer({ min: 1, max: 1000 }),
      minShare: fc.constantFrom(0, 0.5, 1),
    },
    { requiredKeys: ['capacity', 'refillPerSecond'] },
  );

  it('PolicyView accepts exactly what Policy produces, so responses always serialize', () => {
    fc.assert(
      fc.property(policyName, body, (name, b) => {
        const parsed = Policy.safeParse({ name, ...b });
        fc.pre(parsed.success);
        expect(PolicyView.parse(parsed.data)).toEqual(parsed.data);
      }),
    );
  });

  it('a stored spec parses back to the policy its body describes', () => {
    fc.assert(
      fc.property(policyName, body, (name, b) => {
        const parsed = PolicyBody.safeParse(b);
        fc.pre(parsed.success);
        const spec = canonicalSpec(name, parsed.data);
        expect(Policy.parse(spec)).toEqual(Policy.parse({ name, ...b }));
        expect(spec).not.toHaveProperty('maxCost');
        expect(spec).not.toHaveProperty('idleTtlSeconds');
      }),
    );
  });

  it('adds the deployment rules to the body schema', () => {
    const schema = policyBodyFor(['us', 'eu', 'ap']);
    expect(schema.safeParse({ capacity: 10, refillPerSecond: 1, homeRegion: 'eu' }).success).toBe(true);
    const bad = schema.safeParse({ capacity: 10, refillPerSecond: 1, homeRegion: 'mars', minShare: 0.4 });
    expect(bad.error?.issues.map((i) => i.message)).toEqual([
      'homeRegion must be one of the configured regions (us, eu, ap)',
      'minShare × 3 regions must be ≤ 1, or the floors alone exceed the budget',
    ]);
    expect(schema.safeParse({ capacity: 10, refillPerSecond: 1, minShare: 1 / 3 }).success).toBe(true);
  });

  it('requires at least one budget field and nothing else', () => {
    expect(BudgetPatch.safeParse({}).success).toBe(false);
    expect(BudgetPatch.safeParse({ capacity: 5 }).success).toBe(true);
    expect(BudgetPatch.safeParse({ refillPerSecond: 0.5 }).success).toBe(true);
    expect(BudgetPatch.safeParse({ capacity: 5, maxCost: 1 }).success).toBe(false);
    expect(BudgetPatch.safeParse({ capacity: 0 }).success).toBe(false);
  });

  it('coerces and bounds the audit query', () => {
    expect(AuditQuery.parse({})).toEqual({ limit: 50 });
    expect(AuditQuery.parse({ limit: '10', before: '7', policy: 'a.b' })).toEqual({
      limit: 10,
      before: 7,
      policy: 'a.b',
    });
    expect(AuditQuery.safeParse({ limit: '1001' }).success).toBe(false);
    expect(AuditQuery.parse({ moves: 'hide' })).toEqual({ limit: 50, moves: 'hide' });
    expect(AuditQuery.safeParse({ moves: 'collapse' }).success).toBe(false);
  });
});
