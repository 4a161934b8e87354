/**
 * Issue 25: names a caller or a NATS peer sends ("constructor", "__proto__", "toString", …) are never looked up on
 * an object's prototype: the helpers of core/own-keys.ts, the records zod parses, and every core lookup that took a
 * name from outside (a policy's classes and subjects, a lender's class, an allocation record's regions and
 * overrides, the CLI's commands).
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { acceptLoan } from '../../../core/borrowing/lender.js';
import { ManualClock } from '../../../core/clock.js';
import { AgentLease } from '../../../core/lease/agent-lease.js';
import { allocationProblem, defaultRenewalBounds } from '../../../core/lease/trust-checks.js';
import { hasOwnKey, ownRecord, ownRecordOf, ownValue, setOwn } from '../../../core/own-keys.js';
import { parsePolicy, PolicySpec, withClass } from '../../../core/policy/policy.js';
import type { LoanRequest } from '../../../core/wire/loan.js';
import { AllocationRecord, type Renewal } from '../../../core/wire/protocol.js';
import { run } from '../../../cli/run.js';

const PROTOTYPE_NAMES = [
  'constructor',
  '__proto__',
  'toString',
  'hasOwnProperty',
  'valueOf',
  'isPrototypeOf',
];

describe('core/own-keys.ts', () => {
  it('ownValue and hasOwnKey see own properties only', () => {
    const record: Record<string, number> = { a: 1 };
    for (const name of PROTOTYPE_NAMES) {
      expect(ownValue(record, name), name).toBeUndefined();
      expect(hasOwnKey(record, name), name).toBe(false);
    }
    expect(ownValue(record, 'a')).toBe(1);
    expect(ownValue(undefined, 'a')).toBeUndefined();
    expect(hasOwnKey(record, 'a')).toBe(true);
  });

  it('setOwn and ownRecordOf write "__proto__" as a key, never as the prototype', () => {
    const record: Record<string, unknown> = {};
    setOwn(record, '__proto__', { polluted: true });
    expect(Object.getPrototypeOf(record)).toBe(Object.prototype);
    expect(Object.keys(record)).toEqual(['__proto__']);
    expect((record as { polluted?: unknown }).polluted).toBeUndefined();
    expect(ownValue(record, '__proto__')).toEqual({ polluted: true });
    const built = ownRecordOf([
      ['__proto__', 1],
      ['constructor', 2],
    ]);
    expect(Object.getPrototypeOf(built)).toBe(Object.prototype);
    expect(JSON.stringify(built)).toBe('{"__proto__":1,"constructor":2}');
  });

  it('ownRecord refuses a "__proto__" key that z.record drops in silence, and keeps every other name', () => {
    const raw = JSON.parse('{"__proto__": 1, "constructor": 2}') as unknown;
    // eslint-disable-next-line no-restricted-syntax -- what zod does without the guard
    expect(z.record(z.string(), z.number()).parse(raw)).toEqual({ constructor: 2 });
    const refused = ownRecord(z.string(), z.number()).safeParse(raw);
    expect(refused.success).toBe(false);
    expect(refused.error?.issues).toEqual([expect.objectContaining({ code: 'custom', path: ['__proto__'] })]);
    expect(ownRecord(z.string(), z.number()).parse({ constructor: 2, toString: 3 })).toEqual({
      constructor: 2,
      toString: 3,
    });
    // Not an object: the record's own issue, as before.
    expect(ownRecord(z.string(), z.number()).safeParse('x').error?.issues[0]?.code).toBe('invalid_type');
  });
});

describe('policies', () => {
  const classes = { enterprise: { capacity: 100, refillPerSecond: 1 } };

  it('a subject named __proto__ is refused with a reason; constructor and toString are ordinary subjects', () => {
    const r = PolicySpec.safeParse({
      capacity: 10,
      refillPerSecond: 1,
      classes,
      subjects: JSON.parse('{"__proto__": "enterprise"}') as unknown,
    });
    expect(r.success).toBe(false);
    expect(r.error?.issues.map((i) => i.path.join('.'))).toEqual(['subjects.__proto__']);
    const named = PolicySpec.parse({
      capacity: 10,
      refillPerSecond: 1,
      classes: { constructor: { capacity: 100, refillPerSecond: 1 } },
      subjects: { toString: 'constructor', constructor: 'constructor' },
    });
    expect(Object.keys(named.subjects ?? {})).toEqual(['toString', 'constructor']);
    expect(ownValue(named.classes, 'constructor')).toEqual({ capacity: 100, refillPerSecond: 1, maxCost: 1 });
  });

  it('a subject naming a class the policy does not define is refused, prototype names included', () => {
    for (const cls of ['constructor', 'tostring', 'valueof']) {
      const r = PolicySpec.safeParse({
        capacity: 10,
        refillPerSecond: 1,
        classes,
        subjects: { 'tenant-1': cls },
      });
      expect(r.success, cls).toBe(false);
    }
  });

  it('withClass throws for a prototype name, never sizes a policy from Object', () => {
    const p = parsePolicy({ name: 'api', capacity: 10, refillPerSecond: 1, classes });
    for (const name of PROTOTYPE_NAMES) expect(() => withClass(p, name), name).toThrow(RangeError);
  });
});

describe('loans', () => {
  it('a lender refuses a loan ask naming a prototype name as its class', () => {
    const policy = parsePolicy({
      name: 'api',
      capacity: 10,
      refillPerSecond: 1,
      classes: { enterprise: { capacity: 100, refillPerSecond: 1 } },
    });
    const ask: LoanRequest = {
      fromRegion: 'eu',
      policy: 'api',
      version: 1,
      subject: 's',
      mode: 'fill',
      amountMicros: 1_000_000,
      budgetMs: 1000,
      deadlineAtMs: 10_000,
    };
    expect(acceptLoan({ ...ask, class: 'enterprise' }, policy, 1_000)).toMatchObject({
      policy: { capacity: 100 },
    });
    for (const cls of ['constructor', 'tostring', 'valueof']) {
      expect(acceptLoan({ ...ask, class: cls }, policy, 1_000), cls).toMatchObject({
        error: 'unknown_class',
      });
    }
  });
});

describe('allocation records with prototype names', () => {
  const renewal: Renewal = {
    coordinatorId: 'c',
    leaseMs: 600_000,
    graceMs: 1_200_000,
    minRevision: 0,
    learning: false,
    reportIntervalMs: 1000,
  };
  const record = (over: Partial<AllocationRecord> = {}): AllocationRecord => ({
    policy: 'p',
    version: 1,
    epoch: 1,
    safe: { us: 0.3, eu: 0.3, ap: 0.3 },
    idleTtlSeconds: 60,
    default: { shares: { us: 0.3, eu: 0.3, ap: 0.3 }, pending: {}, epoch: 1 },
    overrides: {},
    updatedAt: 0,
    ...over,
  });

  it('shares of 1/1/1 with a pending share for a region named "constructor" are refused (the sum was NaN)', () => {
    const forged = AllocationRecord.parse(
      record({ default: { shares: { us: 1, eu: 1, ap: 1 }, pending: { constructor: 0 }, epoch: 2 } }),
    );
    expect(allocationProblem(forged)).toMatch(/sum to/);
    const inOverride = AllocationRecord.parse(
      record({
        overrides: { s: { shares: { us: 1, eu: 1 }, pending: { tostring: 0, constructor: 0 }, epoch: 1 } },
      }),
    );
    expect(allocationProblem(inOverride)).toMatch(/sum to/);
  });

  it('a record with a "__proto__" region or override is refused by its schema', () => {
    const raw = (json: string) => JSON.parse(json) as unknown;
    const shares = '{"us": 0.3, "eu": 0.3, "ap": 0.3}';
    const unit = `{"shares": ${shares}, "pending": {}, "epoch": 1}`;
    const base = `"policy": "p", "version": 1, "epoch": 1, "idleTtlSeconds": 60, "updatedAt": 0, "default": ${unit}`;
    expect(
      AllocationRecord.safeParse(raw(`{${base}, "safe": {"__proto__": 1}, "overrides": {}}`)).success,
    ).toBe(false);
    expect(
      AllocationRecord.safeParse(raw(`{${base}, "safe": ${shares}, "overrides": {"__proto__": ${unit}}}`))
        .success,
    ).toBe(false);
    expect(AllocationRecord.safeParse(raw(`{${base}, "safe": ${shares}, "overrides": {}}`)).success).toBe(
      true,
    );
  });

  it('an agent deciding for subjects named like prototype members gets the default share, not a TypeError', () => {
    const clock = new ManualClock(1_750_000_000_000);
    const lease = new AgentLease({
      region: 'us',
      clock,
      skewMs: 1000,
      renewalBounds: { ...defaultRenewalBounds, maxLeaseMs: 600_000, maxGraceMs: 1_200_000 },
    });
    expect(lease.applyRecord('p', record(), 1)).toBeUndefined();
    lease.recordsLoaded();
    lease.renewed(renewal, clock.now());
    for (const subject of PROTOTYPE_NAMES) {
      expect(lease.shareFor('p', subject), subject).toEqual({ share: 0.3, epoch: 1 });
      expect(lease.regionShares('p', subject), subject).toEqual({ us: 0.3, eu: 0.3, ap: 0.3 });
    }
  });
});

describe('the command line', () => {
  it('a command named like a prototype member is an unknown command (exit 2), never Object called', async () => {
    for (const name of ['constructor', 'toString', '__proto__']) {
      let err = '';
      const status = await run([name], {
        env: {},
        root: '.',
        stdout: () => undefined,
        stderr: (s: string) => {
          err += s;
        },
      });
      expect(status, name).toBe(2);
      expect(err).toContain(`unknown command "${name}"`);
    }
  });
});
