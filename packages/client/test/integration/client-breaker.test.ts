/**
 * The client's breaker and failure modes against a real agent process frozen with SIGSTOP: after repeated
 * timeouts the client stops waiting and answers by the failure mode at once, lets one probe through after the
 * reset time (half-open), and closes again once the agent answers. The fallback bucket decides while the agent
 * cannot; a fail-open answer says what it is. An overloaded agent (503 AGT_ERR_OVERLOADED, Retry-After) is
 * answered by the failure mode, counted, and does not open the breaker.
 */
import { describe, expect, it } from 'vitest';
import { AgentClient, type BreakerState, type Decision } from '@quotaplane/client';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentProcessOnOwnRedis } from '../../../../test/helpers/agent-process.js';
import { eventually } from '../../../../test/helpers/wait.js';

const TIMEOUT_MS = 400;
const RESET_MS = 1500;

async function timed(call: () => Promise<Decision>): Promise<{ decision: Decision; ms: number }> {
  const started = performance.now();
  const decision = await call();
  return { decision, ms: performance.now() - started };
}

const own = agentProcessOnOwnRedis({
  policies: {
    work: { capacity: 1000, refillPerSecond: 100 },
    small: { capacity: 5, refillPerSecond: 0.001 },
  },
  env: {
    // The overload test freezes Redis: admitted decisions wait for it rather than fail at once.
    QP_MAX_IN_FLIGHT: '2',
    QP_OVERLOAD_RETRY_AFTER_MS: '3000',
    QP_STORE_TIMEOUT_MS: '8000',
    QP_DECISION_DEADLINE_MS: '9000',
  },
});

describe('the client breaker against a frozen agent (SIGSTOP)', () => {
  it('stops waiting after repeated timeouts, probes when half-open, and closes once the agent answers', async () => {
    const states: BreakerState[] = [];
    const closed = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: TIMEOUT_MS,
      breaker: { volumeThreshold: 3, errorPercent: 50, resetMs: RESET_MS },
      onBreakerChange: (s) => states.push(s),
    });
    const open = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: TIMEOUT_MS,
      onUnavailable: 'open',
      breaker: { volumeThreshold: 3, errorPercent: 50, resetMs: 60_000 },
    });
    const local = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: TIMEOUT_MS,
      onUnavailable: 'local',
      fallback: { capacity: 4, refillPerSecond: 0.001 },
      breaker: { volumeThreshold: 3, errorPercent: 50, resetMs: 60_000 },
    });
    const subject = uniquePrefix('frozen');
    try {
      own.agent.pause();
      // Three calls wait out the timeout each; then the breaker is open.
      for (let i = 0; i < 3; i++) {
        const { decision, ms } = await timed(() => closed.check('work', subject));
        expect(ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 5);
        expect(decision).toMatchObject({
          allowed: false,
          degraded: 'fail_closed',
          failure: 'timeout',
          retryAfterMs: 1000,
          headers: { 'Retry-After': '1' },
          results: [{ policy: 'work', allowed: false, reason: 'agent_unreachable' }],
        });
        // No fake numbers: the agent said nothing about the bucket.
        expect(decision.results[0]).not.toHaveProperty('limit');
        expect(decision.results[0]).not.toHaveProperty('remaining');
      }
      expect(closed.breakerState).toBe('open');
      // Open: every call is answered by the failure mode without asking the agent.
      const fast: number[] = [];
      for (let i = 0; i < 20; i++) {
        const { decision, ms } = await timed(() => closed.check('work', subject));
        fast.push(ms);
        expect(decision).toMatchObject({ allowed: false, degraded: 'fail_closed', failure: 'breaker_open' });
      }
      // Each answered well inside the timeout it no longer waits for (measured, generous for a busy machine).
      expect(Math.max(...fast)).toBeLessThan(TIMEOUT_MS / 2);
      expect(closed.stats()).toMatchObject({
        breaker: 'open',
        decided: 0,
        failures: { timeout: 3, breaker_open: 20, connection: 0, overloaded: 0 },
        degraded: { fail_closed: 23, fail_open: 0, fallback: 0 },
      });

      // Fail open says it is failing open, with no limit or remaining it did not get.
      for (let i = 0; i < 4; i++) {
        const d = await open.check('work', subject);
        expect(d).toMatchObject({ allowed: true, retryAfterMs: 0, degraded: 'fail_open', headers: {} });
        expect(d.results[0]).toEqual({
          policy: 'work',
          allowed: true,
          resetMs: null,
          retryAfterMs: 0,
          reason: 'agent_unreachable',
        });
      }
      expect(open.stats()).toMatchObject({ breaker: 'open', failures: { timeout: 3, breaker_open: 1 } });

      // The fallback bucket (4 tokens, per process) decides while the agent cannot, timeouts and open breaker alike.
      const fallback: Decision[] = [];
      for (let i = 0; i < 6; i++) fallback.push(await local.check('work', subject));
      expect(fallback.map((d) => d.allowed)).toEqual([true, true, true, true, false, false]);
      expect(fallback.map((d) => d.results[0]!.remaining)).toEqual([3, 2, 1, 0, 0, 0]);
      expect(fallback.map((d) => d.results[0]!.limit)).toEqual([4, 4, 4, 4, 4, 4]);
      expect(fallback.map((d) => d.degraded)).toEqual(Array(6).fill('fallback'));
      expect(fallback.map((d) => d.failure)).toEqual([
        'timeout',
        'timeout',
        'timeout',
        'breaker_open',
        'breaker_open',
        'breaker_open',
      ]);
      expect(fallback[4]!.results[0]).toMatchObject({ reason: 'emergency_bucket', allowed: false });
      expect(fallback[4]!.retryAfterMs).toBeGreaterThan(900_000);
      // Another subject has a bucket of its own.
      expect((await local.check('work', `${subject}-b`)).results[0]).toMatchObject({
        allowed: true,
        remaining: 3,
      });

      // Half-open: one probe goes to the (still frozen) agent, times out, and the breaker opens again.
      await eventually(() => closed.breakerState === 'half_open', RESET_MS * 4, 'half-open');
      const probe = await timed(() => closed.check('work', subject));
      expect(probe.ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 5);
      expect(probe.decision.failure).toBe('timeout');
      expect(closed.breakerState).toBe('open');
      expect((await closed.check('work', subject)).failure).toBe('breaker_open');
    } finally {
      own.agent.resume();
    }
    // Thawed: the next probe is answered by the agent and the breaker closes.
    await eventually(() => closed.breakerState === 'half_open', RESET_MS * 4, 'half-open after SIGCONT');
    const recovered = await closed.check('work', subject);
    expect(recovered).toMatchObject({ allowed: true, results: [{ policy: 'work', limit: 1000 }] });
    expect(recovered.degraded).toBeUndefined();
    expect(closed.breakerState).toBe('closed');
    expect((await closed.check('work', subject)).degraded).toBeUndefined();
    expect(states).toEqual(['open', 'half_open', 'open', 'half_open', 'closed']);
    expect(closed.stats()).toMatchObject({ decided: 2, failures: { timeout: 4, breaker_open: 21 } });
    closed.close();
    open.close();
    local.close();
  }, 60_000);

  it('opens after volumeThreshold exchanges in a row got no answer, however many good ones the window holds', async () => {
    const client = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: TIMEOUT_MS,
      breaker: { volumeThreshold: 3, errorPercent: 50, resetMs: 60_000, windowMs: 60_000 },
      // Every check to the agent: a grant would decide the busy subject in the process during the freeze, and
      // its hand-back at close would reach the agent while the next test holds Redis frozen (one of its two
      // in-flight slots taken).
      grants: false,
    });
    const subject = uniquePrefix('busy');
    // Traffic before the freeze: thirty answered exchanges in the window.
    for (let i = 0; i < 30; i++) expect((await client.check('work', subject)).allowed).toBe(true);
    try {
      own.agent.pause();
      for (let i = 0; i < 3; i++) expect((await client.check('work', subject)).failure).toBe('timeout');
      // Three failed of 33 (9 %): by the percentage alone it stayed closed, and every decision waited a timeout
      // (a frozen agent under 200 decisions/s opened it only after 7.5 s).
      expect(client.breakerState).toBe('open');
      expect((await client.check('work', subject)).failure).toBe('breaker_open');
      expect(client.stats()).toMatchObject({ decided: 30, failures: { timeout: 3, breaker_open: 1 } });
    } finally {
      own.agent.resume();
    }
    client.close();
    // Thawed, the agent decides the three exchanges it was sent while frozen: done before the next test freezes
    // Redis (else they would wait on it and hold two of its in-flight slots).
    await eventually(
      async () =>
        ((await (await fetch(`${own.agent.url}/readyz`)).json()) as { inFlight?: number }).inFlight === 0,
      10_000,
      'the agent has answered what it was sent while frozen',
    );
  }, 30_000);
});

describe('an overloaded agent (503 AGT_ERR_OVERLOADED)', () => {
  it('is answered by the failure mode with the agent Retry-After, counted, and does not open the breaker', async () => {
    const client = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: 15_000,
      breaker: { volumeThreshold: 1, errorPercent: 1, resetMs: 60_000 },
    });
    const subject = uniquePrefix('crowd');
    await own.redis.pause();
    let held: Promise<Decision>[] = [];
    let shed: Decision[];
    try {
      // Two decisions fill the agent's in-flight bound (they wait on the frozen Redis)…
      held = [client.check('small', subject), client.check('small', subject)];
      await eventually(
        async () => {
          const ready = (await (await fetch(`${own.agent.url}/readyz`)).json()) as { inFlight?: number };
          return ready.inFlight === 2;
        },
        10_000,
        'the agent to hold its in-flight bound',
      );
      // …so the next ones are shed at once.
      shed = [await client.check('small', subject), await client.check('small', subject)];
    } finally {
      await own.redis.resume();
    }
    for (const d of shed) {
      expect(d).toMatchObject({
        allowed: false,
        degraded: 'fail_closed',
        failure: 'overloaded',
        retryAfterMs: 3000,
        headers: { 'Retry-After': '3' },
      });
    }
    const decided = await Promise.all(held);
    expect(decided.map((d) => d.allowed)).toEqual([true, true]);
    expect(decided.map((d) => d.degraded)).toEqual([undefined, undefined]);
    const stats = client.stats();
    expect(stats.breaker).toBe('closed');
    expect(stats).toMatchObject({ decided: 2, degraded: { fail_closed: 2 } });
    expect(stats.failures.overloaded).toBe(2);
    expect(stats.failures.timeout + stats.failures.connection + stats.failures.breaker_open).toBe(0);
    // The admitted decisions were charged once each: of 5 tokens, 3 are left before this one.
    expect((await client.check('small', subject)).results[0]).toMatchObject({ allowed: true, remaining: 2 });
    client.close();
  }, 60_000);
});
