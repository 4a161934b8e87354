import { describe, expect, it } from 'vitest';
import { EventQueue } from '../../../../simulations/engine/event-queue.js';
import { Network, type LinkSpec } from '../../../../simulations/engine/network.js';
import { Random } from '../../../../simulations/engine/random.js';

function net(spec: LinkSpec, nodes = 3) {
  const queue = new EventQueue();
  const names = Array.from({ length: nodes }, (_, i) => `n${i}`);
  const links = names.map(() => names.map(() => spec));
  return { queue, network: new Network(names, links, queue, new Random(9, 'net')) };
}

const drain = (queue: EventQueue) => {
  while (queue.size > 0) queue.pop()!.run();
};

describe('simulated network', () => {
  it('delivers after exactly the link delay when there is no jitter', () => {
    const { queue, network } = net({ delayMs: 40, jitterMs: 0, loss: 0 });
    const arrivals: number[] = [];
    queue.at(1000, () => {
      network.send(0, 1, 'data', () => arrivals.push(queue.now));
    });
    drain(queue);
    expect(arrivals).toEqual([41_000]);
    expect(network.counts).toEqual({ control: 0, data: 1, lost: 0, dropped: 0 });
  });

  it('adds exponential jitter of the given mean and loses the given fraction', () => {
    const { queue, network } = net({ delayMs: 10, jitterMs: 5, loss: 0.2 });
    const n = 20_000;
    const delays: number[] = [];
    for (let i = 0; i < n; i++) network.send(0, 1, 'control', () => delays.push(queue.now / 1000));
    drain(queue);
    const lossRate = network.counts.lost / n;
    expect(lossRate).toBeGreaterThan(0.18);
    expect(lossRate).toBeLessThan(0.22);
    expect(delays.length).toBe(n - network.counts.lost);
    expect(Math.min(...delays)).toBeGreaterThanOrEqual(10);
    const mean = delays.reduce((a, b) => a + b, 0) / delays.length;
    expect(mean).toBeGreaterThan(14.7);
    expect(mean).toBeLessThan(15.3);
    expect(network.counts.control).toBe(n);
  });

  it('drops messages on a cut link, including those in flight, and delivers again once healed', () => {
    const { queue, network } = net({ delayMs: 10, jitterMs: 0, loss: 0 });
    const got: string[] = [];
    network.send(0, 1, 'data', () => got.push('in flight'));
    queue.at(5000, () => network.setCut(0, 1, true));
    queue.at(6000, () => {
      expect(network.send(1, 0, 'data', () => got.push('while cut'))).toBe(false);
      network.send(0, 2, 'data', () => got.push('other link'));
    });
    queue.at(20_000, () => {
      network.setCut(0, 1, false);
      network.send(0, 1, 'data', () => got.push('healed'));
    });
    drain(queue);
    expect(got).toEqual(['other link', 'healed']);
    expect(network.counts.dropped).toBe(2);
  });

  it('drops everything to and from a node that is down', () => {
    const { queue, network } = net({ delayMs: 1, jitterMs: 0, loss: 0 });
    const got: number[] = [];
    network.setDown(2, true);
    network.send(0, 2, 'control', () => got.push(1));
    network.send(2, 0, 'control', () => got.push(2));
    network.send(0, 1, 'control', () => got.push(3));
    drain(queue);
    expect(got).toEqual([3]);
    expect(network.isDown(2)).toBe(true);
  });
});
