import { describe, expect, it } from 'vitest';
import {
  lowestChanged,
  lowestIssued,
  noteIssued,
  restoredUnit,
} from '../../../../core/lease/allocation-records.js';
import type { Unit } from '../../../../core/lease/allocation-state.js';

const unit = (shares: number[]): Unit => ({
  shares,
  pending: shares.map(() => undefined),
  pendingRevision: undefined,
  pendingSeq: 0,
  pendingSince: 0,
  target: undefined,
  moving: false,
  epoch: 1,
});

describe('lowest shares issued within the window (the coordinator’s memory for agents)', () => {
  it('remembers the lowest share of each region for one window after it was replaced', () => {
    const u = unit([0.5, 0.5]);
    noteIssued(u, 0, 60_000);
    u.shares = [0.8, 0.2];
    noteIssued(u, 10_000, 60_000);
    // us grew: it held 0.5 within the window; eu shrank: nothing below its share now.
    expect(lowestIssued(u, 10_000, 60_000)).toEqual([0.5, undefined]);
    expect(lowestIssued(u, 69_999, 60_000)).toEqual([0.5, undefined]);
    expect(lowestIssued(u, 70_000, 60_000)).toEqual([undefined, undefined]);
  });

  it('asks for a rewrite once a lowest aged out, or at once when an agent from before is registered', () => {
    const u = unit([0.5, 0.5]);
    noteIssued(u, 0, 60_000);
    u.shares = [0.8, 0.2];
    noteIssued(u, 10_000, 60_000);
    u.writtenLowest = lowestIssued(u, 10_000, 60_000);
    expect(lowestChanged(u, 20_000, 60_000)).toBe(false);
    expect(lowestChanged(u, 20_000, 60_000, true)).toBe(true);
    expect(lowestChanged(u, 70_000, 60_000)).toBe(true);
  });

  it('a restarted coordinator keeps a persisted lowest for one more window', () => {
    const u = restoredUnit(
      ['us', 'eu'],
      { shares: { us: 0.8, eu: 0.2 }, pending: {}, epoch: 3, lowest: { us: 0.5 } },
      7,
      1_000_000,
    );
    expect(lowestIssued(u, 1_000_000, 60_000)).toEqual([0.5, undefined]);
    expect(lowestIssued(u, 1_059_999, 60_000)).toEqual([0.5, undefined]);
    expect(lowestIssued(u, 1_060_000, 60_000)).toEqual([undefined, undefined]);
    expect(lowestChanged(u, 1_060_000, 60_000)).toBe(true);
  });
});
