import { describe, expect, it } from 'vitest';
import type { AgentLease, InForceChange } from '../../../core/lease/agent-lease.js';
import { ConservationChecker } from '../../harness/conservation-checker.js';

/** A stand-in lease that emits the in-force changes a test scripts. */
function fakeLease(): { lease: AgentLease; emit: (c: InForceChange) => void } {
  let listener: ((c: InForceChange) => void) | undefined;
  const lease = { onInForce: (l: (c: InForceChange) => void) => (listener = l) } as unknown as AgentLease;
  return { lease, emit: (c) => listener!(c) };
}

describe('the conservation checker itself', () => {
  it('takes the largest share among agents of one region and flags a sum above 1', () => {
    const checker = new ConservationChecker();
    const us1 = fakeLease();
    const us2 = fakeLease();
    const eu = fakeLease();
    checker.watch('us-1', 'us', us1.lease);
    checker.watch('us-2', 'us', us2.lease);
    checker.watch('eu-1', 'eu', eu.lease);
    us1.emit({ policy: 'p', subject: undefined, share: 0.5, at: 1 });
    us2.emit({ policy: 'p', subject: undefined, share: 0.4, at: 2 });
    eu.emit({ policy: 'p', subject: undefined, share: 0.5, at: 3 });
    expect(() => checker.assertHeld()).not.toThrow();
    us2.emit({ policy: 'p', subject: undefined, share: 0.6, at: 4 });
    expect(() => checker.assertHeld()).toThrow(/budget conservation violated 1 time/);
    expect(checker.violations[0]).toMatchObject({ at: 4, policy: 'p', byRegion: { us: 0.6, eu: 0.5 } });
  });

  it('checks overridden subjects against the other regions default shares', () => {
    const checker = new ConservationChecker();
    const us = fakeLease();
    const eu = fakeLease();
    checker.watch('us-1', 'us', us.lease);
    checker.watch('eu-1', 'eu', eu.lease);
    us.emit({ policy: 'p', subject: undefined, share: 0.3, at: 1 });
    eu.emit({ policy: 'p', subject: undefined, share: 0.7, at: 1 });
    us.emit({ policy: 'p', subject: 'hot', share: 0.5, at: 2 });
    expect(checker.violations).toEqual([
      { at: 2, policy: 'p', subject: 'hot', sum: 1.2, byRegion: { us: 0.5, eu: 0.7 } },
    ]);
    us.emit({ policy: 'p', subject: 'hot', share: 0, at: 3, removed: true });
    expect(checker.violations).toHaveLength(1);
  });

  it('forgets a stopped agent', () => {
    const checker = new ConservationChecker();
    const a = fakeLease();
    const b = fakeLease();
    checker.watch('a', 'us', a.lease);
    checker.watch('b', 'eu', b.lease);
    a.emit({ policy: 'p', subject: undefined, share: 0.6, at: 1 });
    checker.unwatch('a');
    b.emit({ policy: 'p', subject: undefined, share: 0.6, at: 2 });
    expect(() => checker.assertHeld()).not.toThrow();
  });
});
