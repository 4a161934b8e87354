/**
 * Every error `code` the source defines is documented in docs/errors.md, found by scanning the source rather than
 * by a list someone must remember to update: `code = '…'` and `code: '…'` in TypeScript, the error replies of the
 * Lua scripts, and the string literals of the agent's and coordinator's problem codes.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CODE_DIRS, REPO_ROOT, repoFiles } from '../../helpers/repo-files.js';

const root = REPO_ROOT;
const SOURCE_DIRS = [...CODE_DIRS, 'scripts', 'lua', 'packages'];
/** The families of project error codes; other `code` values (gRPC's `OK`, zod's `custom`) are not ours. */
const FAMILY = '(?:AGT|COORD|QP|SIM|STACK)_[A-Z0-9_]*[A-Z0-9]';
const PATTERNS = [
  new RegExp(`\\bcode\\s*[:=]\\s*'(${FAMILY})'`, 'g'),
  new RegExp(`error_reply\\('(${FAMILY})\\b`, 'g'),
  /'((?:AGT|COORD)_ERR_[A-Z0-9_]*[A-Z0-9])'/g,
];

function definedCodes(): Map<string, string> {
  const found = new Map<string, string>();
  for (const file of SOURCE_DIRS.flatMap((d) => repoFiles(d, /\.(ts|lua)$/))) {
    const text = readFileSync(join(root, file), 'utf8');
    for (const pattern of PATTERNS) {
      for (const match of text.matchAll(pattern)) {
        if (!found.has(match[1]!)) found.set(match[1]!, file);
      }
    }
  }
  return found;
}

describe('error codes in the source', () => {
  const doc = readFileSync(join(root, 'docs/errors.md'), 'utf8');
  const documented = new Set([...doc.matchAll(/^\| `([A-Z0-9_]+)`/gm)].map((m) => m[1]));
  const codes = definedCodes();

  it('the scan finds the codes of every layer (it is not looking at nothing)', () => {
    for (const known of ['AGT_ERR_INVALID_REQUEST', 'COORD_ERR_VALIDATION', 'QP_BADARG', 'SIM_ERR_CONFIG']) {
      expect(codes.has(known), known).toBe(true);
    }
  });

  it('each has a row of its own in docs/errors.md', () => {
    const missing = [...codes].filter(([code]) => !documented.has(code)).map(([c, file]) => `${c} (${file})`);
    expect(missing).toEqual([]);
  });
});
