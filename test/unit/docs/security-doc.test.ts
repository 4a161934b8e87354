/** docs/security.md's table of attacks names real tests: each row's file exists and holds a test of that name. */
import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const doc = readFileSync('docs/security.md', 'utf8');
const section = doc.slice(doc.indexOf('## Attacks and the tests'), doc.indexOf('## Privacy'));
const rows = section
  .split('\n')
  .filter((l) => l.startsWith('| ') && !l.startsWith('| attack') && !l.startsWith('| ---'))
  .map((l) => l.split('|').map((c) => c.trim()))
  .map(([, attack, file, test]) => ({ attack: attack!, file: file!, test: test! }));

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('docs/security.md', () => {
  it('lists the attacks of issue 14 with a test each', () => {
    expect(rows.length).toBeGreaterThanOrEqual(25);
    for (const r of rows) expect(r.attack.length, JSON.stringify(r)).toBeGreaterThan(0);
  });

  it.each(rows.map((r) => [r.file, r.test]))('%s has a test named "%s"', (file, test) => {
    expect(existsSync(file)).toBe(true);
    const source = readFileSync(file, 'utf8');
    expect(source).toMatch(new RegExp(`it(\\.each\\([^)]*\\))?\\(\\s*(['"\`])${escape(test)}\\2`));
  });
});
