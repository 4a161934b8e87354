/**
 * The forwarder's batching, on a stand-in NATS connection: decisions forwarded to one home by one task leave
 * together, and they leave when that task is done, not at the end of the event-loop turn behind every other
 * callback of the poll phase. And the farthest link's allowance it keeps, as answers measure its round trips.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { NatsForwarder } from '../../../../regional-agent/strict/nats-forwarder.js';

/** A connection that records each request and answers none (the forwarder then times out, unreachable). */
function recording() {
  const sent: unknown[] = [];
  const nc = {
    isClosed: () => false,
    isDraining: () => false,
    request: (_subject: string, data: string) => {
      sent.push(JSON.parse(data));
      return new Promise(() => undefined);
    },
  } as unknown as NatsConnection;
  return { sent, forwarder: new NatsForwarder({ nc, region: 'eu', namespace: 'qp' }) };
}

const request = { checks: [{ policy: 'p', subject: 's', cost: 1 }], dryRun: false };

describe('NatsForwarder batching', () => {
  it("sends one task's decisions for one home as one batch", async () => {
    const { sent, forwarder } = recording();
    await Promise.resolve();
    const asked = [forwarder.decide('ap', request, 30), forwarder.decide('ap', request, 30)];
    await Promise.allSettled(asked);
    expect(sent).toHaveLength(1);
    expect((sent[0] as { batch: unknown[] }).batch).toHaveLength(2);
  });

  it('sends before the callbacks already waiting in the event loop run', async () => {
    const { sent, forwarder } = recording();
    // A callback queued before the decision: under a burst, hundreds of these stand between a decision and the
    // end of the turn.
    const seenByNext = new Promise<number>((resolve) => setImmediate(() => resolve(sent.length)));
    await Promise.resolve();
    const asked = forwarder.decide('ap', request, 30);
    expect(await seenByNext).toBe(1);
    await asked.catch(() => undefined);
  });

  it('counts 250 ms to a home before its first answer, the configured round trip when named', () => {
    const { forwarder } = recording();
    expect(forwarder.roundTripMs('ap')).toBe(250);
    expect(forwarder.linkAllowanceMs('ap')).toBe(313);
    const named = new NatsForwarder({
      nc: {} as NatsConnection,
      region: 'eu',
      roundTrips: new Map([['ap eu', 220]]),
    });
    expect(named.roundTripMs('ap')).toBe(220);
  });

  it("knows its farthest link's allowance: the configured matrix's, or none while no home is known", () => {
    const { forwarder } = recording();
    // Nothing configured, no home expected or forwarded to: no link (an agent without strict policies homed
    // elsewhere promises its deadline alone).
    expect(forwarder.farthestAllowanceMs()).toBe(0);
    const named = new NatsForwarder({
      nc: {} as NatsConnection,
      region: 'eu',
      roundTrips: new Map([
        ['eu us', 70],
        ['ap eu', 220],
        ['ap us', 150],
      ]),
    });
    // eu's farthest is ap, 220 ms: 1.25 times, rounded up.
    expect(named.farthestAllowanceMs()).toBe(275);
  });

  it('counts a home not measured yet as its forwards wait: once expected, or from its first forward', async () => {
    const { forwarder } = recording();
    // Its own region is never a home to forward to.
    forwarder.expectHomes(['eu']);
    expect(forwarder.farthestAllowanceMs()).toBe(0);
    // A strict policy homed in ap: 250 ms until ap answers, 1.25 times (what a forward to it waits).
    forwarder.expectHomes(['ap', 'eu']);
    expect(forwarder.farthestAllowanceMs()).toBe(313);
    expect(forwarder.farthestAllowanceMs()).toBe(forwarder.linkAllowanceMs('ap'));
    forwarder.expectHomes([]);
    expect(forwarder.farthestAllowanceMs()).toBe(0);
    // A forwarder told no homes counts one from its first forward on, before any answer, and keeps it.
    const asked = forwarder.decide('us', request, 30);
    expect(forwarder.farthestAllowanceMs()).toBe(313);
    await asked.catch(() => undefined);
    forwarder.expectHomes([]);
    expect(forwarder.farthestAllowanceMs()).toBe(313);
  });

  it('keeps the configured farthest over a nearer expected home, and a farther unmeasured one over it', () => {
    const named = new NatsForwarder({
      nc: {} as NatsConnection,
      region: 'eu',
      roundTrips: new Map([['eu us', 70]]),
    });
    expect(named.farthestAllowanceMs()).toBe(88);
    named.expectHomes(['us']);
    expect(named.farthestAllowanceMs()).toBe(88);
    // ap is not in the matrix and has not answered: 250 ms.
    named.expectHomes(['us', 'ap']);
    expect(named.farthestAllowanceMs()).toBe(313);
  });

  describe('as answers measure the round trips', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    /** A connection whose home answers every request `answerMs` ms later (timers faked: exact round trips). */
    function answering(roundTrips?: Map<string, number>) {
      const delay = { answerMs: 0 };
      const result = {
        policy: 'p',
        allowed: true,
        remaining: 1,
        limit: 2,
        resetMs: 0,
        retryAfterMs: 0,
        mode: 'strict',
      };
      const nc = {
        isClosed: () => false,
        isDraining: () => false,
        request: () =>
          new Promise((resolve) => {
            setTimeout(() => resolve({ json: () => ({ results: [result] }) }), delay.answerMs);
          }),
      } as unknown as NatsConnection;
      return { delay, forwarder: new NatsForwarder({ nc, region: 'eu', namespace: 'qp', roundTrips }) };
    }

    async function answered(
      forwarder: NatsForwarder,
      home: string,
      answerMs: number,
      delay: { answerMs: number },
    ) {
      delay.answerMs = answerMs;
      const asked = forwarder.decide(home, request, 1000);
      await vi.advanceTimersByTimeAsync(answerMs);
      await asked;
    }

    it('follows the measured round trip of the farthest home, up and down', async () => {
      vi.useFakeTimers();
      const { delay, forwarder } = answering();
      await answered(forwarder, 'ap', 200, delay);
      // A first answer is the round trip: 200 ms, 1.25 times.
      expect(forwarder.roundTripMs('ap')).toBe(200);
      expect(forwarder.farthestAllowanceMs()).toBe(250);
      // Smoothed: 200 + 0.2 × (100 − 200) = 180 ms.
      await answered(forwarder, 'ap', 100, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(225);
      // A nearer home does not lower it; a farther one raises it.
      await answered(forwarder, 'us', 40, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(225);
      await answered(forwarder, 'sa', 300, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(375);
    });

    it("lowers an expected home's allowance to its measured round trip once it answers", async () => {
      vi.useFakeTimers();
      const { delay, forwarder } = answering();
      forwarder.expectHomes(['ap']);
      expect(forwarder.farthestAllowanceMs()).toBe(313);
      await answered(forwarder, 'ap', 40, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(50);
    });

    it('keeps a configured round trip over what answers measure', async () => {
      vi.useFakeTimers();
      const { delay, forwarder } = answering(new Map([['ap eu', 220]]));
      expect(forwarder.farthestAllowanceMs()).toBe(275);
      await answered(forwarder, 'ap', 400, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(275);
      // An unnamed home measured farther than the matrix's farthest takes over.
      await answered(forwarder, 'us', 240, delay);
      expect(forwarder.farthestAllowanceMs()).toBe(300);
    });
  });
});
