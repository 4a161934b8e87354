import { describe, expect, it } from 'vitest';
import { AgentMetrics } from '../../../../regional-agent/observability/metrics.js';
import { Admission, retryAfterSeconds } from '../../../../regional-agent/resilience/admission.js';
import { WireTimeoutError, onTheWire } from '../../../../regional-agent/resilience/wire-timeout.js';

describe('admission control', () => {
  it('admits up to the in-flight bound, sheds beyond it, and counts each shed by route', async () => {
    const metrics = new AgentMetrics({ region: 'us', processMetrics: false });
    const admission = new Admission({ maxInFlight: 2, maxEventLoopDelayMs: 0, retryAfterMs: 1000 }, metrics);
    const first = admission.enter('http');
    const second = admission.enter('strict');
    expect(typeof first).toBe('function');
    expect(typeof second).toBe('function');
    expect(admission.enter('forward_auth')).toBe('in_flight');
    expect(admission.enter('http')).toBe('in_flight');
    expect(admission.inFlight).toBe(2);
    if (typeof first === 'function') {
      first();
      first(); // leaving twice frees one place only
    }
    expect(admission.inFlight).toBe(1);
    expect(typeof admission.enter('http')).toBe('function');
    const text = await metrics.registry.metrics();
    expect(text).toContain(
      'quotaplane_shed_decisions_total{region="us",route="forward_auth",reason="overloaded",cause="in_flight"} 1',
    );
    expect(text).toContain(
      'quotaplane_shed_decisions_total{region="us",route="http",reason="overloaded",cause="in_flight"} 1',
    );
    expect(text).toContain('quotaplane_in_flight_decisions 2');
    admission.close();
  });

  it('Retry-After is whole seconds, rounded up, at least one', () => {
    expect([1, 999, 1000, 1001, 2500].map(retryAfterSeconds)).toEqual(['1', '1', '1', '2', '3']);
  });
});

describe('timeouts on the wire', () => {
  it('no reply at all times out with WireTimeoutError, and a late reply is dropped', async () => {
    let settle: (v: string) => void = () => undefined;
    const call = onTheWire(new Promise<string>((r) => (settle = r)), 5, 'call');
    await expect(call).rejects.toBeInstanceOf(WireTimeoutError);
    settle('too late');
    await expect(call).rejects.toThrow('call: no reply within 5 ms of the write');
  });
});
