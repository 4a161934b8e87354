/**
 * The lease's side of direct-decision terms (regional-agent/terms/): a term is entered like a decision and left
 * only when it has run out, so a shrink is acknowledged only after it; the restart hold is entered before any
 * record; `stableForMs`, `defaultShare` and `overrideSubjects` bound and size a term.
 */
import { describe, expect, it } from 'vitest';
import { ManualClock, monotonicOf } from '../../../../core/clock.js';
import { AgentLease } from '../../../../core/lease/agent-lease.js';
import { defaultRenewalBounds } from '../../../../core/lease/trust-checks.js';
import type { AllocationRecord, Renewal } from '../../../../core/wire/protocol.js';

const renewal: Renewal = {
  coordinatorId: 'c',
  leaseMs: 6000,
  graceMs: 12_000,
  minRevision: 0,
  learning: false,
  reportIntervalMs: 1000,
};

function setup() {
  const clock = new ManualClock(1_750_000_000_000);
  const lease = new AgentLease({
    region: 'us',
    clock,
    skewMs: 1000,
    startupWaitMs: 3000,
    renewalBounds: defaultRenewalBounds,
  });
  const acks: number[] = [];
  lease.onAck((revision) => acks.push(revision));
  let revision = 0;
  const apply = (
    us: number,
    options: {
      pending?: number;
      eu?: number;
      safe?: number;
      overrides?: AllocationRecord['overrides'];
    } = {},
  ) => {
    revision++;
    const record: AllocationRecord = {
      policy: 'p',
      version: 1,
      epoch: revision,
      safe: { us: options.safe ?? 0.5, eu: 1 - (options.safe ?? 0.5) },
      idleTtlSeconds: 60,
      default: {
        shares: { us, eu: options.eu ?? 1 - us },
        pending: options.pending === undefined ? {} : { us: options.pending },
        epoch: revision,
      },
      overrides: options.overrides ?? {},
      updatedAt: clock.now(),
    };
    expect(lease.applyRecord('p', record, revision)).toBeUndefined();
    return revision;
  };
  return { clock, lease, apply, acks };
}

describe('agent lease: terms hold acknowledgements', () => {
  it('a shrink applied while a term of the old record is held is acknowledged only once the term is left', () => {
    const { clock, lease, apply, acks } = setup();
    const r = apply(0.6);
    lease.recordsLoaded();
    lease.renewed(renewal, monotonicOf(clock));
    const leaveTerm = lease.enter('p');
    const decision = lease.enter('p');
    decision();
    // r + 1 shrinks us from 0.6 to 0.4: the coordinator waits for its acknowledgement before growing eu.
    const shrink = apply(0.4, { pending: 0.6, eu: 0.4 });
    expect(shrink).toBe(r + 1);
    expect(lease.shareFor('p', 'a')?.share).toBe(0.4);
    expect(lease.ackRevision).toBe(r);
    clock.advance(999);
    lease.poll();
    expect(lease.ackRevision).toBe(r);
    expect(acks).toEqual([]);
    leaveTerm();
    expect(lease.ackRevision).toBe(r + 1);
    expect(acks).toEqual([r + 1]);
  });

  it('the restart hold, entered before any record, holds every acknowledgement until it is left', () => {
    const { clock, lease, apply, acks } = setup();
    const leaveHold = lease.enter('');
    apply(0.6);
    lease.recordsLoaded();
    lease.renewed(renewal, monotonicOf(clock));
    const shrink = apply(0.4, { pending: 0.6, eu: 0.4 });
    expect(lease.ackRevision).toBe(0);
    expect(acks).toEqual([]);
    leaveHold();
    expect(lease.ackRevision).toBe(shrink);
    expect(acks).toEqual([shrink]);
  });
});

describe('agent lease: what bounds and sizes a term', () => {
  it('stableForMs: the rest of a valid lease; a lapsed lease only rises; settled, 0 when a renewal would shrink', () => {
    const { clock, lease, apply } = setup();
    apply(0.6, { safe: 0.5 });
    expect(lease.stableForMs('p')).toBe(0); // no lease yet: nothing in force
    expect(lease.stableForMs('unknown')).toBe(0);
    lease.recordsLoaded();
    lease.renewed(renewal, monotonicOf(clock));
    expect(lease.mode()).toBe('valid');
    expect(lease.stableForMs('p')).toBe(6000);
    clock.advance(5800);
    expect(lease.stableForMs('p')).toBe(200);
    clock.advance(201);
    expect(lease.mode()).toBe('lapsed');
    expect(lease.stableForMs('p')).toBe(Infinity);
    clock.advance(12_000);
    expect(lease.mode()).toBe('settled');
    // Settled at the safe share 0.5; issued 0.6 ≥ 0.5: a renewal is a rise.
    expect(lease.stableForMs('p')).toBe(Infinity);
    // Issued 0.4 < safe 0.5: a renewal (any moment) shrinks 0.5 → 0.4, which no acknowledgement waits for.
    apply(0.4, { safe: 0.5 });
    expect(lease.shareFor('p', 'a')?.share).toBe(0.5);
    expect(lease.stableForMs('p')).toBe(0);
  });

  it('defaultShare is the default vector whatever subjects have overrides; overrideSubjects lists them', () => {
    const { clock, lease, apply } = setup();
    const unit = (us: number) => ({ shares: { us, eu: 1 - us }, pending: {}, epoch: 9 });
    // An override keyed by the empty string (no valid subject is): shareFor('') would find it, defaultShare never.
    apply(0.3, { overrides: { vip: unit(0.9), '': unit(0.8) } });
    lease.recordsLoaded();
    lease.renewed(renewal, monotonicOf(clock));
    expect(lease.shareFor('p', '')?.share).toBe(0.8);
    expect(lease.defaultShare('p')).toEqual({ share: 0.3, epoch: 1 });
    expect(lease.shareFor('p', 'vip')?.share).toBe(0.9);
    expect(lease.overrideSubjects('p')).toEqual(['vip', '']);
    expect(lease.overrideSubjects('unknown')).toEqual([]);
    expect(lease.defaultShare('unknown')).toBeUndefined();
  });
});
