import { describe, expect, it } from 'vitest';
import { EventQueue } from '../../../../simulations/engine/event-queue.js';
import { Random } from '../../../../simulations/engine/random.js';

describe('simulator event queue', () => {
  it('runs events in time order, ties in the order they were scheduled', () => {
    const queue = new EventQueue();
    const random = new Random(5, 'queue');
    const fired: [number, number][] = [];
    for (let i = 0; i < 2000; i++) {
      const at = random.int(300);
      queue.at(at, () => fired.push([at, i]));
    }
    while (queue.size > 0) {
      const event = queue.pop()!;
      expect(queue.now).toBe(event.at);
      event.run();
    }
    expect(fired).toHaveLength(2000);
    const sorted = [...fired].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    expect(fired).toEqual(sorted);
  });

  it('lets events schedule others, never in the past', () => {
    const queue = new EventQueue();
    const seen: number[] = [];
    queue.at(10, () => {
      seen.push(queue.now);
      queue.at(10, () => seen.push(queue.now));
      queue.at(15, () => seen.push(queue.now));
    });
    queue.at(12, () => seen.push(queue.now));
    while (queue.size > 0) queue.pop()!.run();
    expect(seen).toEqual([10, 10, 12, 15]);
    expect(() => queue.at(14, () => undefined)).toThrow(RangeError);
    expect(queue.peekTime()).toBe(Infinity);
  });
});
