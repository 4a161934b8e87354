import { describe, expect, it } from 'vitest';
import {
  etagOf,
  failedPrecondition,
  parseTagCondition,
} from '../../../../coordinator/policies/preconditions.js';

describe('conditional request headers', () => {
  it('parses *, strong and weak tags, and lists', () => {
    expect(parseTagCondition('*')).toBe('*');
    expect(parseTagCondition(' "42" ')).toEqual([{ weak: false, opaque: '42' }]);
    expect(parseTagCondition('W/"7", "8",W/""')).toEqual([
      { weak: true, opaque: '7' },
      { weak: false, opaque: '8' },
      { weak: true, opaque: '' },
    ]);
  });

  it.each(['42', '"42', "'42'", '"4"2"', '*, "1"', '', 'w/"1"'])('refuses %j with a readable reason', (v) => {
    expect(() => parseTagCondition(v)).toThrow(SyntaxError);
  });

  it('compares If-Match strongly and If-None-Match weakly', () => {
    const tag = (s: string) => parseTagCondition(s);
    expect(failedPrecondition({ ifMatch: tag('"5"') }, 5)).toBeUndefined();
    expect(failedPrecondition({ ifMatch: tag('"4", "5"') }, 5)).toBeUndefined();
    expect(failedPrecondition({ ifMatch: tag('W/"5"') }, 5)).toBe(
      'If-Match: the policy\'s current ETag is "5"',
    );
    expect(failedPrecondition({ ifMatch: tag('"4"') }, 5)).toBe(
      'If-Match: the policy\'s current ETag is "5"',
    );
    expect(failedPrecondition({ ifMatch: '*' }, 5)).toBeUndefined();
    expect(failedPrecondition({ ifMatch: '*' }, undefined)).toBe('If-Match: the policy does not exist');
    expect(failedPrecondition({ ifNoneMatch: '*' }, undefined)).toBeUndefined();
    expect(failedPrecondition({ ifNoneMatch: '*' }, 1)).toBe(
      'If-None-Match: * but the policy already exists',
    );
    expect(failedPrecondition({ ifNoneMatch: tag('W/"1"') }, 1)).toBe(
      'If-None-Match: the policy\'s current ETag is "1"',
    );
    expect(failedPrecondition({ ifNoneMatch: tag('"2"') }, 1)).toBeUndefined();
    expect(failedPrecondition({}, undefined)).toBeUndefined();
  });

  it('quotes revisions as ETags', () => {
    expect(etagOf(12)).toBe('"12"');
    expect(parseTagCondition(etagOf(12))).toEqual([{ weak: false, opaque: '12' }]);
  });
});
