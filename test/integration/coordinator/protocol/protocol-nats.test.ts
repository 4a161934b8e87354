/**
 * The conservation protocol end to end on real servers: NATS with JetStream, one Redis per region, the
 * coordinator with its protocol engine, 3 regions × 2 agents deciding at a set demand. The checker watches the
 * shares in force at every agent throughout; admitted totals across regions are checked against C + R·W.
 * Timings are compressed: rounds of 200 ms, heartbeats every 200 ms, leases of 1.5 s, grace of 4 s.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  sleep,
  startProtocolStack,
  worstWindowRatio,
  type ProtocolStack,
} from '../../../helpers/fixture/index.js';
import { within } from '../../../helpers/within.js';

const near = (shares: Record<string, number>, want: Record<string, number>, tolerance = 0.06) =>
  Object.entries(want).every(([r, s]) => Math.abs((shares[r] ?? 0) - s) <= tolerance);

/**
 * Let the stack keep deciding under the checker until `n` more decisions were admitted everywhere: a soak bounded
 * by progress, not by a fixed sleep (every share change it makes meanwhile goes through the checker).
 */
async function keepDeciding(stack: ProtocolStack, n: number, what: string): Promise<void> {
  const from = stack.admissions.length;
  await eventually(
    () => stack.admissions.length >= from + n,
    15_000,
    `${n} more admitted decisions ${what}`,
    25,
  );
}

describe('conservation protocol on real NATS and Redis (3 regions × 2 agents)', () => {
  let stack: ProtocolStack;

  beforeAll(async () => {
    stack = await startProtocolStack();
    // 60 per second, burst 30: demand below will exceed the budget so shares matter.
    // Idle TTL compressed like the timers: a region that shrank may grow again 2.5 s later (the cool-down).
    await stack.createPolicy('writes', { capacity: 30, refillPerSecond: 60, idleTtlSeconds: 2 });
    stack.setDemand('us', 80);
    stack.setDemand('eu', 10);
    stack.setDemand('ap', 10);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  it('every agent adopts the policy and a lease, and shares follow demand', async () => {
    await eventually(() => stack.agents.every((a) => a.holder.ready()), 10_000, 'every agent ready', 25);
    const took = await eventually(
      async () => near(await stack.shares(), { us: 0.73, eu: 0.135, ap: 0.135 }),
      15_000,
      'shares to follow demand',
      25,
    );
    expect(took).toBeLessThan(15_000);
    stack.checker.assertHeld();
  }, 30_000);

  it('moves shares within the stated time after 80% of the demand shifts to another region', async () => {
    stack.setDemand('us', 10);
    stack.setDemand('eu', 80);
    // Here rounds are 5× faster and smoothing 5× shorter, the confirmation 2 s: 2 s, then 12 steps of at most 0.05
    // (core/rebalance/settings.ts maxStep) of 200 ms, about 4.5 s in all (4.2 s measured); 12 s allows for CI load.
    let last: Record<string, number> = {};
    const took = await eventually(
      async () => near((last = await stack.shares()), { us: 0.135, eu: 0.73, ap: 0.135 }),
      12_000,
      'shares to follow the shift',
      25,
    ).catch((error: Error) => {
      throw new Error(
        `${error.message}; shares ${JSON.stringify(last)}; decisions ${JSON.stringify(stack.agents.map((a) => [a.region, a.decisions, a.failures]))}`,
      );
    });
    expect(took).toBeLessThan(12_000);
    stack.checker.assertHeld();
  }, 25_000);

  it('a budget PATCH reaches every region within 2 s', async () => {
    const start = Date.now();
    const res = await stack.admin('PATCH', '/v1/policies/writes/budget', { capacity: 40 });
    expect(res.status).toBe(200);
    await eventually(
      () => stack.agents.every((a) => stack.policyAt(a)?.capacity === 40),
      2000,
      'every agent to see capacity 40',
      25,
    );
    expect(Date.now() - start).toBeLessThan(2000);
    // Back to the budget the window check below assumes.
    await stack.admin('PATCH', '/v1/policies/writes/budget', { capacity: 30 });
    await eventually(
      () => stack.agents.every((a) => stack.policyAt(a)?.capacity === 30),
      2000,
      'every agent to see capacity 30',
      25,
    );
    stack.admissions.length = 0;
  }, 10_000);

  it('stays within the budget through an agent restart (graceful and not)', async () => {
    const [a, b] = stack.agents.filter((x) => x.region === 'eu');
    // Each step bounded on its own: once, on the containers backend, this test hung past its 30 s somewhere here.
    await within(stack.stopAgent(a!, true), 8000, 'a graceful stop of an eu agent');
    await within(stack.stopAgent(b!, false), 8000, 'an abrupt stop of an eu agent');
    await within(stack.startAgent('eu'), 8000, 'a new eu agent loading its records');
    stack.setDemand('eu', 80);
    await eventually(
      () => stack.agents.filter((x) => x.region === 'eu').every((x) => x.holder.ready()),
      10_000,
      'the new eu agent to be ready',
      25,
    );
    await keepDeciding(stack, 40, 'after the restart');
    stack.checker.assertHeld();
  }, 30_000);

  it('stays within the budget through a coordinator kill and restart', async () => {
    await stack.killCoordinator();
    // Past lease and grace every agent settles at its safe share; none may keep its lease.
    await eventually(
      () => stack.agents.every((a) => ['lapsed', 'settled'].includes(a.holder.lease.mode())),
      10_000,
      'every agent lapsed or settled without a coordinator',
      25,
    );
    await stack.startCoordinator();
    await eventually(
      () => stack.agents.every((a) => a.holder.lease.mode() === 'valid'),
      10_000,
      'agents renewed again',
      25,
    );
    await keepDeciding(stack, 40, 'after the coordinator came back');
    stack.checker.assertHeld();
  }, 30_000);

  it('stays within the budget through a NATS restart', async () => {
    await stack.nats.stop();
    // The fault itself: NATS stays down for one second (two heartbeat intervals).
    await sleep(1000);
    await stack.nats.start();
    await eventually(
      () => stack.agents.every((a) => a.holder.lease.mode() === 'valid'),
      15_000,
      'agents renewed after NATS came back',
      25,
    );
    await keepDeciding(stack, 20, 'after NATS came back');
    stack.checker.assertHeld();
  }, 30_000);

  it('control traffic: one heartbeat and one usage message per agent per report interval, and the metrics show it', async () => {
    const count = async () => {
      const text = await (await stack.admin('GET', '/metrics')).text();
      const value = (kind: string) =>
        Number(
          new RegExp(`quotaplane_protocol_messages_total\\{kind="${kind}"\\} (\\d+)`).exec(text)?.[1] ?? NaN,
        );
      return { heartbeat: value('heartbeat'), usage: value('usage'), text };
    };
    const agents = stack.agents.length;
    const before = await count();
    const started = Date.now();
    // Measure over at least 15 heartbeats per agent (about 3 s), counted rather than slept.
    let after = before;
    await eventually(
      async () => {
        after = await count();
        return after.heartbeat - before.heartbeat >= 15 * agents;
      },
      10_000,
      '15 heartbeats per agent',
      25,
    );
    const seconds = (Date.now() - started) / 1000;
    // Heartbeats every 200 ms here (1 s by default): 5 per agent per second, give or take timer jitter.
    const perAgent = (after.heartbeat - before.heartbeat) / seconds / agents;
    expect(perAgent).toBeGreaterThan(3.5);
    expect(perAgent).toBeLessThan(5.5);
    expect((after.usage - before.usage) / seconds / agents).toBeCloseTo(perAgent, 0);
    expect(after.text).toMatch(/quotaplane_region_report_lag_seconds\{region="eu"\}/);
    expect(after.text).toMatch(/quotaplane_region_agents\{region="us",state="live"\} 2/);
  }, 15_000);

  it('admitted totals across regions stay within C + R·W for every window', () => {
    expect(stack.admissions.length).toBeGreaterThan(100);
    // 30 + 60·W, with 50 ms of timing jitter on each window.
    const ratio = worstWindowRatio(stack.admissions, 30, 60, 50);
    expect(ratio).toBeLessThanOrEqual(1);
    expect(stack.checker.events).toBeGreaterThan(0);
    stack.checker.assertHeld();
  }, 60_000);
});
