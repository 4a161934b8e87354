import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, Errors } from '../../../coordinator/errors.js';

const doc = readFileSync(new URL('../../../docs/errors.md', import.meta.url), 'utf8');
const start = doc.indexOf('## Coordinator (`COORD_ERR_*`)');
const section = doc.slice(start, doc.indexOf('\n## ', start + 1));

/** code → status, from the table rows of the coordinator section. */
const documented = new Map(
  [...section.matchAll(/^\| `(COORD_ERR_[A-Z_]+)` +\| (\d{3}) +\|/gm)].map((m) => [m[1]!, Number(m[2])]),
);

describe('coordinator error codes', () => {
  it('are unique and all start with COORD_ERR_', () => {
    expect(new Set(ERROR_CODES).size).toBe(ERROR_CODES.length);
    expect(ERROR_CODES.length).toBe(Object.keys(Errors).length);
    for (const code of ERROR_CODES) expect(code).toMatch(/^COORD_ERR_[A-Z_]+$/);
  });

  it('are each documented exactly once in docs/errors.md with the status they answer with', () => {
    expect(start).toBeGreaterThan(-1);
    for (const E of Object.values(Errors)) {
      const e = new E();
      expect(doc.split(`\`${e.code}\``).length - 1, e.code).toBe(1);
      expect(documented.get(e.code), e.code).toBe(e.statusCode);
    }
    expect([...documented.keys()].sort()).toEqual([...ERROR_CODES].sort());
  });

  it('carry 4xx for the client and 5xx only for outages and bugs', () => {
    const fiveHundreds = Object.values(Errors)
      .map((E) => new E())
      .filter((e) => (e.statusCode ?? 500) >= 500)
      .map((e) => e.code);
    expect(fiveHundreds.sort()).toEqual([
      'COORD_ERR_INTERNAL',
      'COORD_ERR_NOT_LEADER',
      'COORD_ERR_NOT_READY',
      'COORD_ERR_STORE_UNAVAILABLE',
    ]);
  });

  it('format their messages from arguments', () => {
    expect(new Errors.POLICY_NOT_FOUND('writes').message).toBe('No policy named writes');
    expect(new Errors.FORBIDDEN('read', 'change policies').message).toBe(
      'The read role may not change policies',
    );
  });
});
