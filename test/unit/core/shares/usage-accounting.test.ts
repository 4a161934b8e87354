/**
 * core/shares/usage-accounting.ts, the one rule agents and simulated agents count usage by: totals, the demand shares
 * follow (refusals within a subject's own rate only), the bounded list of constrained subjects.
 */
import { describe, expect, it } from 'vitest';
import {
  MAX_SUBJECTS_PER_INTERVAL,
  PolicyUsageCounter,
  subjectDemand,
} from '../../../../core/shares/usage-accounting.js';
import { MAX_CONSTRAINED_PER_POLICY, PolicyUsage } from '../../../../core/wire/protocol.js';

describe('usage accounting', () => {
  it('sums requested, admitted and denied cost and resets at each report', () => {
    const m = new PolicyUsageCounter();
    m.record('s1', 2, true, 0.5);
    m.record('s1', 3, false, 0);
    m.record('s2', 1, true, 0.99);
    expect(m.decisions).toBe(3);
    const u = m.take('p', 1000, undefined);
    expect([u.requested, u.admitted, u.denied, u.demand]).toEqual([6, 3, 3, 6]);
    expect(PolicyUsage.parse(u)).toEqual(u);
    expect(m.take('p', 1000, 2)).toEqual({
      policy: 'p',
      requested: 0,
      admitted: 0,
      denied: 0,
      demand: 0,
      constrained: [],
    });
  });

  it("counts a subject's refusals as demand only up to its own global rate over the interval", () => {
    expect(subjectDemand(10, 1, 2)).toBe(2);
    expect(subjectDemand(10, 5, 2)).toBe(5); // a burst admitted counts whole
    expect(subjectDemand(1.5, 1, 2)).toBe(1.5); // within its rate: everything asked
    const m = new PolicyUsageCounter();
    // A noisy subject asks 40 tokens in 1 s against R = 2: 1 admitted, 39 refused; its demand is 2.
    m.record('noisy', 1, true, 0.2);
    for (let i = 0; i < 39; i++) m.record('noisy', 1, false, 0);
    // A quiet one asks 1.5 and is refused 0.5 of it: all of it is demand.
    m.record('quiet', 1, true, 0.05);
    m.record('quiet', 0.5, false, 0);
    const u = m.take('p', 1000, 2);
    expect([u.requested, u.admitted, u.denied, u.demand]).toEqual([41.5, 2, 39.5, 3.5]);
    // Over 250 ms the allowance is 0.5 tokens.
    m.record('noisy', 1, false, 0);
    m.record('noisy', 1, false, 0);
    expect(m.take('p', 250, 2).demand).toBe(0.5);
  });

  it("caps each subject's refusals at its own class's rate, the policy's R for the rest", () => {
    // R = 2/s; enterprise tenants get 10× (20/s). Both hammer 100 tokens in 1 s.
    const m = new PolicyUsageCounter();
    for (let i = 0; i < 100; i++) m.record('enterprise-1', 1, i < 30, 0, 20);
    for (let i = 0; i < 100; i++) m.record('default-1', 1, i < 3, 0, 2);
    // A subject whose decisions carry no rate falls back to the policy's R given to take.
    for (let i = 0; i < 100; i++) m.record('default-2', 1, false, 0);
    const u = m.take('p', 1000, 2);
    // enterprise-1: its 30 admitted (a burst counts whole); default-1: 3 admitted; default-2: R × 1 s = 2.
    expect([u.requested, u.admitted, u.demand]).toEqual([300, 33, 30 + 3 + 2]);
    // Within an interval where admissions are below the rate, the class's allowance is what counts: 20 × 0.5 s.
    for (let i = 0; i < 100; i++) m.record('enterprise-1', 1, i < 4, 0, 20);
    for (let i = 0; i < 100; i++) m.record('default-1', 1, i < 0, 0, 2);
    expect(m.take('p', 500, 2).demand).toBe(10 + 1);
    // Counted at the policy's R alone (the rule before classes), the enterprise tenant would count 1 of its 10.
    for (let i = 0; i < 100; i++) m.record('enterprise-1', 1, false, 0);
    expect(m.take('p', 500, 2).demand).toBe(1);
  });

  it('counts a subject at the last rate decided under when its class changes mid-interval', () => {
    const m = new PolicyUsageCounter();
    for (let i = 0; i < 50; i++) m.record('tenant', 1, false, 0, 2);
    for (let i = 0; i < 50; i++) m.record('tenant', 1, false, 0, 20);
    expect(m.take('p', 1000, 2).demand).toBe(20);
    // With neither its own rate nor the policy's, every refusal counts.
    for (let i = 0; i < 50; i++) m.record('tenant', 1, false, 0);
    expect(m.take('p', 1000, undefined).demand).toBe(50);
  });

  it('keeps memory bounded: past the exact bound admissions count and refusals do not, and the report says so', () => {
    const m = new PolicyUsageCounter();
    for (let i = 0; i < MAX_SUBJECTS_PER_INTERVAL; i++) m.record(`s${i}`, 1, true, 0.5);
    m.record('late', 1, true, 0.5);
    m.record('late', 1, false, 0);
    const u = m.take('p', 1000, 2);
    expect([u.requested, u.admitted, u.denied, u.demand]).toEqual([
      MAX_SUBJECTS_PER_INTERVAL + 2,
      MAX_SUBJECTS_PER_INTERVAL + 1,
      1,
      MAX_SUBJECTS_PER_INTERVAL + 1,
    ]);
    expect(u.truncated).toBe(true);
    expect(u.constrained).toEqual([{ subject: 'late', requested: 1, denied: 1 }]);
  });

  it('reports subjects denied or left under a tenth of their bucket, most denied first, at most the wire bound', () => {
    const m = new PolicyUsageCounter();
    m.record('s1', 1, true, 0.99); // comfortable: not constrained
    m.record('s2', 1, true, 0.09); // under 10% left: near capacity
    for (let s = 10; s < 20; s++) for (let k = 0; k <= s - 10; k++) m.record(`s${s}`, 1, false, 0);
    const { constrained, truncated } = m.take('p', 1000, 2);
    expect(constrained).toHaveLength(MAX_CONSTRAINED_PER_POLICY);
    expect(truncated).toBe(true);
    expect(constrained[0]).toEqual({ subject: 's19', requested: 10, denied: 10 });
    expect(constrained.map((c) => c.subject)).not.toContain('s1');
    expect(constrained.map((c) => c.subject)).not.toContain('s2'); // crowded out by denials
    const lone = new PolicyUsageCounter();
    lone.record('s2', 1, true, 0.5);
    lone.record('s2', 1, true, 0.09);
    // The exact count of the subject's requests, not only of its constrained decisions.
    expect(lone.take('p', 1000, 2).constrained).toEqual([{ subject: 's2', requested: 2, denied: 0 }]);
  });

  it('reports watched subjects with their counts here, zero included', () => {
    const m = new PolicyUsageCounter();
    m.record('hot', 2, true, 0.5);
    m.record('hot', 1, false, 0);
    expect(m.take('p', 1000, 2, new Set(['hot', 'quiet'])).watched).toEqual([
      { subject: 'hot', requested: 3, denied: 1 },
      { subject: 'quiet', requested: 0, denied: 0 },
    ]);
  });
});
