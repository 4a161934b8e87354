import { describe, expect, it } from 'vitest';
import { ManualClock, monotonicOf, steadyClock } from '../../../../core/clock.js';
import { AgentLease } from '../../../../core/lease/agent-lease.js';
import { defaultRenewalBounds } from '../../../../core/lease/trust-checks.js';
import type { AllocationRecord, Renewal } from '../../../../core/wire/protocol.js';

const renewal: Renewal = {
  coordinatorId: 'c',
  leaseMs: 600_000,
  graceMs: 1_200_000,
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
    renewalBounds: { ...defaultRenewalBounds, maxLeaseMs: 600_000, maxGraceMs: 1_200_000 },
  });
  const acks: number[] = [];
  lease.onAck((ackRevision) => acks.push(ackRevision));
  let revision = 0;
  /** The record of `p` giving us `us` (eu the rest, unless said), with a pending shrink, safe share, overrides. */
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
    const safe = options.safe ?? 0.5;
    const record: AllocationRecord = {
      policy: 'p',
      version: 1,
      epoch: revision,
      safe: { us: safe, eu: 1 - safe },
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

describe('agent lease: refill floors', () => {
  it('a share that only rose needs no floor: the script refills at most at the stored rate', () => {
    const { clock, lease, apply } = setup();
    apply(0.2);
    lease.recordsLoaded();
    lease.renewed(renewal, clock.now());
    clock.advance(10_000);
    apply(0.3);
    clock.advance(3000);
    apply(0.4);
    clock.advance(500);
    // No floor for buckets; a sliding log, whose window still holds entries admitted at 0.2, enforces `lowest`.
    expect(lease.shareFor('p', 't')).toEqual({ share: 0.4, epoch: 3, lowest: 0.2 });
  });

  it('after a dip, buckets written before the dip refill at most at the lowest share in force since', () => {
    const { clock, lease, apply } = setup();
    apply(0.5);
    lease.recordsLoaded();
    lease.renewed(renewal, clock.now());
    clock.advance(10_000);
    apply(0.1);
    const dipAt = clock.now();
    clock.advance(5000);
    apply(0.6);
    clock.advance(500);
    expect(lease.shareFor('p', 't')).toEqual({
      share: 0.6,
      epoch: 3,
      floor: { sinceMs: dipAt + 1000, share: 0.1 },
      lowest: 0.1,
    });
  });

  it('a dip older than the idle TTL needs no floor: every bucket written before it expired', () => {
    const { clock, lease, apply } = setup();
    apply(0.5);
    lease.recordsLoaded();
    lease.renewed(renewal, clock.now());
    apply(0.1);
    clock.advance(1000);
    apply(0.6);
    expect(lease.shareFor('p', 't')!.floor).toBeDefined();
    clock.advance(62_000);
    expect(lease.shareFor('p', 't')!.floor).toBeUndefined();
    expect(lease.shareFor('p', 't')!.lowest).toBeUndefined();
  });

  it('a lapse dips the share to the safe share; a renewal after it floors older buckets at that', () => {
    const { clock, lease, apply } = setup();
    apply(0.9);
    lease.recordsLoaded();
    lease.renewed({ ...renewal, leaseMs: 5000, graceMs: 20_000 }, clock.now());
    clock.advance(6000);
    expect(lease.shareFor('p', 't')!.share).toBe(0.5); // lapsed: min(0.9, safe 0.5)
    const lapsedAt = clock.now() - 1000;
    lease.renewed({ ...renewal, leaseMs: 5000, graceMs: 20_000 }, clock.now());
    expect(lease.shareFor('p', 't')).toEqual({
      share: 0.9,
      epoch: 1,
      floor: { sinceMs: lapsedAt + 1000, share: 0.5 },
      lowest: 0.5,
    });
  });
});

describe('agent lease: stale renewals', () => {
  it('ignores a reply later than one report interval after its heartbeat, and reports which renewal it holds', () => {
    const { clock, lease, apply } = setup();
    apply(0.9);
    lease.recordsLoaded();
    const short = { ...renewal, leaseMs: 5000, graceMs: 20_000 };
    expect(lease.renewed(short, clock.now(), 7)).toBe('accepted');
    expect(lease.renewedSeq).toBe(7);
    clock.advance(6000);
    expect(lease.mode()).toBe('lapsed');
    // A reply to a heartbeat sent 1001 ms ago: the coordinator may think this renewal ran out already.
    const sentAt = clock.now();
    clock.advance(1001);
    expect(lease.renewed(short, sentAt, 8)).toBe('stale');
    expect(lease.staleRenewals).toBe(1);
    expect(lease.renewedSeq).toBe(7);
    expect(lease.mode()).toBe('lapsed');
    expect(lease.shareFor('p', 't')!.share).toBe(0.5);
    // Exactly one interval is still in time.
    const again = clock.now();
    clock.advance(1000);
    expect(lease.renewed(short, again, 9)).toBe('accepted');
    expect(lease.renewedSeq).toBe(9);
    expect(lease.mode()).toBe('valid');
  });
});

describe('agent lease: in-force shares of in-flight decisions', () => {
  it('a decision that started with a valid lease counts at its issued share until it ends; one that started lapsed at min(issued, safe)', () => {
    const { clock, lease, apply } = setup();
    const seen: number[] = [];
    lease.onInForce((c) => {
      if (c.subject === undefined) seen.push(c.share);
    });
    apply(0.9);
    lease.recordsLoaded();
    lease.renewed({ ...renewal, leaseMs: 5000, graceMs: 20_000 }, clock.now());
    // Valid: a decision starts at 0.9, then a shrink to 0.4 arrives while it is in flight.
    const validDecision = lease.enter('p');
    apply(0.4);
    expect(seen.at(-1)).toBe(0.9);
    validDecision();
    expect(seen.at(-1)).toBe(0.4);
    // Lapsed: decisions run at min(0.4, safe 0.5) = 0.4; a grow to 0.8 arrives, then the lease lapses and a
    // decision starts under the 0.8 record at min(0.8, 0.5) = 0.5; a shrink to 0.3 arrives while it is in flight.
    apply(0.8);
    clock.advance(6000);
    lease.poll();
    expect(seen.at(-1)).toBe(0.5);
    const lapsedDecision = lease.enter('p');
    apply(0.3);
    // It may be deciding with 0.5, not with the 0.8 it would have had with a valid lease.
    expect(seen.at(-1)).toBe(0.5);
    lapsedDecision();
    expect(seen.at(-1)).toBe(0.3);
  });
});

describe('agent lease: durations on the monotonic clock', () => {
  it('a backward wall-clock step on a cut-off agent does not keep its lease: it lapses and settles on time', () => {
    const { clock, lease, apply } = setup();
    apply(0.8);
    lease.recordsLoaded();
    lease.renewed({ ...renewal, leaseMs: 6000, graceMs: 12_000 }, clock.monotonic());
    expect(lease.shareFor('p', 't')!.share).toBe(0.8);
    // Cut off: no renewal comes. Five seconds in, the wall clock is stepped back by a minute.
    clock.advance(5000);
    clock.step(-60_000);
    clock.advance(1001);
    // The coordinator counts it lapsed 6 s after the renewal (its own clock): so does the agent, at min(0.8, safe).
    expect(lease.mode()).toBe('lapsed');
    expect(lease.shareFor('p', 't')!.share).toBe(0.5);
    clock.advance(12_000);
    expect(lease.mode()).toBe('settled');
  });

  it('a forward wall-clock step does not end a lease early', () => {
    const { clock, lease, apply } = setup();
    apply(0.8);
    lease.recordsLoaded();
    lease.renewed({ ...renewal, leaseMs: 6000, graceMs: 12_000 }, clock.monotonic());
    clock.step(3_600_000);
    clock.advance(5000);
    expect(lease.mode()).toBe('valid');
    expect(lease.shareFor('p', 't')!.share).toBe(0.8);
  });
});

describe('steadyClock', () => {
  it('reads wall time once, then moves with the monotonic clock only', () => {
    const base = new ManualClock(1_000_000);
    const steady = steadyClock(base);
    base.advance(500);
    base.step(-60_000);
    expect(steady.now()).toBe(1_000_500);
    base.step(3_600_000);
    base.advance(1);
    expect(steady.now()).toBe(1_000_501);
  });
});

describe('agent lease: the ceilings a borrower bounds its lenders by', () => {
  it('a region at its safe share only within the room the others hold leave: a lapsed lender lends from it, a valid one is not believed above its issued share', () => {
    const { lease } = setup();
    let epoch = 0;
    const ceilings = (shares: Record<string, number>, pending: Record<string, number> = {}) => {
      epoch++;
      lease.applyRecord(
        'p',
        {
          policy: 'p',
          version: 1,
          epoch,
          safe: { us: 0.5, eu: 0.5 },
          idleTtlSeconds: 60,
          default: { shares, pending, epoch },
          overrides: {},
          updatedAt: 0,
        },
        epoch,
      );
      return lease.regionCeilings('p', 't');
    };
    // us holds 0.75, eu 0.25, of a policy whose safe split is 0.5/0.5. The coordinator counts eu at its safe
    // share only while eu may be lapsed, and us could then hold no more than 0.5: with us at 0.75, eu decides
    // with 0.25, and a grant from eu above that (a forged or faulty one) is not believed.
    expect(ceilings({ us: 0.75, eu: 0.25 })).toEqual({ us: 0.75, eu: 0.25 });
    // us at 0.25 and eu issued 0.125 while it may be lapsed: the room is 0.75, so eu's safe 0.5 counts in full
    // (and us's too: the room eu leaves it is 0.875).
    expect(ceilings({ us: 0.25, eu: 0.125 })).toEqual({ us: 0.5, eu: 0.5 });
    // A shrink not yet acknowledged counts at its old share, for its region and for the room it leaves.
    expect(ceilings({ us: 0.25, eu: 0.125 }, { us: 0.75 })).toEqual({ us: 0.75, eu: 0.25 });
    // The room never goes below nothing.
    expect(ceilings({ us: 1, eu: 0 })).toEqual({ us: 1, eu: 0 });
  });
});

// Direct-decision terms (regional-agent/terms/): a term is entered like a decision and left only when it has run
// out, so a shrink is acknowledged only after it; the restart hold is entered before any record; `stableForMs`,
// `defaultShare` and `overrideSubjects` bound and size a term.
const leased: Renewal = { ...renewal, leaseMs: 6000, graceMs: 12_000 };

describe('agent lease: terms hold acknowledgements', () => {
  it('a shrink applied while a term of the old record is held is acknowledged only once the term is left', () => {
    const { clock, lease, apply, acks } = setup();
    const r = apply(0.6);
    lease.recordsLoaded();
    lease.renewed(leased, monotonicOf(clock));
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
    lease.renewed(leased, monotonicOf(clock));
    const shrink = apply(0.4, { pending: 0.6, eu: 0.4 });
    expect(lease.ackRevision).toBe(0);
    expect(acks).toEqual([]);
    leaveHold();
    expect(lease.ackRevision).toBe(shrink);
    expect(acks).toEqual([shrink]);
  });
});

describe('agent lease: what bounds and sizes a term', () => {
  it('stableForMs: the rest of a valid lease; 0 once it lapsed or settled, whatever the shares', () => {
    const { clock, lease, apply } = setup();
    apply(0.6, { safe: 0.5 });
    expect(lease.stableForMs('p')).toBe(0); // no lease yet: nothing in force
    expect(lease.stableForMs('unknown')).toBe(0);
    lease.recordsLoaded();
    lease.renewed(leased, monotonicOf(clock));
    expect(lease.mode()).toBe('valid');
    expect(lease.stableForMs('p')).toBe(6000);
    clock.advance(5800);
    expect(lease.stableForMs('p')).toBe(200);
    clock.advance(201);
    expect(lease.mode()).toBe('lapsed');
    // Lapsed at min(0.6, 0.5): a record applied meanwhile may lower the issued share, and a renewal brings it in
    // force at any moment, with no acknowledgement waited for.
    expect(lease.stableForMs('p')).toBe(0);
    clock.advance(12_000);
    expect(lease.mode()).toBe('settled');
    expect(lease.stableForMs('p')).toBe(0);
    apply(0.4, { safe: 0.5 });
    expect(lease.shareFor('p', 'a')?.share).toBe(0.5);
    expect(lease.stableForMs('p')).toBe(0);
    // Renewed: valid again, for the new lease's length.
    lease.renewed(leased, monotonicOf(clock));
    expect(lease.stableForMs('p')).toBe(6000);
  });

  it('defaultShare is the default vector whatever subjects have overrides; overrideSubjects lists them', () => {
    const { clock, lease, apply } = setup();
    const unit = (us: number) => ({ shares: { us, eu: 1 - us }, pending: {}, epoch: 9 });
    // An override keyed by the empty string (no valid subject is): shareFor('') would find it, defaultShare never.
    apply(0.3, { overrides: { vip: unit(0.9), '': unit(0.8) } });
    lease.recordsLoaded();
    lease.renewed(leased, monotonicOf(clock));
    expect(lease.shareFor('p', '')?.share).toBe(0.8);
    expect(lease.defaultShare('p')).toEqual({ share: 0.3, epoch: 1 });
    expect(lease.shareFor('p', 'vip')?.share).toBe(0.9);
    expect(lease.overrideSubjects('p')).toEqual(['vip', '']);
    expect(lease.overrideSubjects('unknown')).toEqual([]);
    expect(lease.defaultShare('unknown')).toBeUndefined();
  });
});
