import { describe, expect, it } from 'vitest';
import { BoundedLru, MAX_LRU_ENTRIES } from '../../../core/bounded-lru.js';

describe('BoundedLru', () => {
  it('forgets the least recently written entry first, and never holds more than its bound', () => {
    const lru = new BoundedLru<number>(3);
    for (const [k, v] of [
      ['a', 1],
      ['b', 2],
      ['c', 3],
    ] as const)
      lru.set(k, v);
    expect(lru.keys()).toEqual(['a', 'b', 'c']);
    lru.set('d', 4);
    expect(lru.size).toBe(3);
    expect(lru.keys()).toEqual(['b', 'c', 'd']);
    expect(lru.get('a')).toBeUndefined();
    lru.set('e', 5);
    expect(lru.keys()).toEqual(['c', 'd', 'e']);
    for (let i = 0; i < 1000; i++) lru.set(`k${i}`, i);
    expect(lru.size).toBe(3);
    expect(lru.keys()).toEqual(['k997', 'k998', 'k999']);
  });

  it('updates a key in place: one entry, the new value, made the most recent', () => {
    const lru = new BoundedLru<string>(3);
    lru.set('a', 'first');
    lru.set('b', 'b');
    lru.set('c', 'c');
    lru.set('a', 'second');
    expect(lru.size).toBe(3);
    expect(lru.get('a')).toBe('second');
    expect(lru.keys()).toEqual(['b', 'c', 'a']);
    // `b` is now the oldest write: the next new key evicts it, not the rewritten `a`.
    lru.set('d', 'd');
    expect(lru.keys()).toEqual(['c', 'a', 'd']);
  });

  it('does not count a read as use: reading an explanation changes no eviction order', () => {
    const lru = new BoundedLru<number>(2);
    lru.set('a', 1);
    lru.set('b', 2);
    expect(lru.get('a')).toBe(1);
    lru.set('c', 3);
    expect(lru.keys()).toEqual(['b', 'c']);
  });

  it('keeps nothing at a bound of 0, and refuses a bound outside 0..1,000,000', () => {
    const none = new BoundedLru<number>(0);
    none.set('a', 1);
    expect(none.size).toBe(0);
    expect(none.get('a')).toBeUndefined();
    expect(() => new BoundedLru(-1)).toThrow(RangeError);
    expect(() => new BoundedLru(1.5)).toThrow(RangeError);
    expect(() => new BoundedLru(MAX_LRU_ENTRIES + 1)).toThrow(/0\.\.1000000/);
    expect(new BoundedLru(MAX_LRU_ENTRIES).maxEntries).toBe(1_000_000);
  });
});
