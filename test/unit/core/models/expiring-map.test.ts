import { describe, expect, it } from 'vitest';
import { ExpiringMap } from '../../../../core/models/expiring-map.js';

describe('ExpiringMap: keys that expire as Redis keys do', () => {
  it('a value is live until its expiresAt, gone at it; DEL counts only a live key', () => {
    const m = new ExpiringMap<{ v: number; expiresAt: number }>();
    m.set('a', { v: 1, expiresAt: 100 });
    m.set('b', { v: 2, expiresAt: 200 });
    expect(m.live('a', 99)?.v).toBe(1);
    expect(m.keys(99)).toEqual(['a', 'b']);
    expect(m.live('a', 100)).toBeUndefined();
    expect(m.keys(100)).toEqual(['b']);
    expect(m.delete('a', 100)).toBe(false);
    expect(m.delete('b', 150)).toBe(true);
    expect(m.delete('b', 150)).toBe(false);
    expect(m.keys(0)).toEqual([]);
  });
});
