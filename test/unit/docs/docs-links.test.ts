/**
 * The docs stand alone: every relative link in README.md and docs/ names a file of this repo, and no page or
 * source file cites a design document outside it.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { CODE_DIRS, REPO_ROOT, repoFiles } from '../../helpers/repo-files.js';

const root = REPO_ROOT;
const pages = [
  'README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

describe('docs', () => {
  it('link only to files that exist in the repo', () => {
    const broken: string[] = [];
    for (const page of pages) {
      const text = readFileSync(join(root, page), 'utf8');
      for (const [, target] of text.matchAll(/\]\(([^)\s#]+)(?:#[^)]*)?\)/g)) {
        if (/^[a-z]+:/i.test(target!)) continue;
        const path = join(dirname(join(root, page)), target!);
        if (!existsSync(path)) broken.push(`${page} → ${target}`);
        else if (relative(root, path).startsWith('..')) broken.push(`${page} → ${target} (outside the repo)`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('cite no design document outside the repo', () => {
    const dirs = [...CODE_DIRS, 'scripts', 'lua', 'test', 'packages', 'docs', 'bench'];
    const self = relative(root, fileURLToPath(import.meta.url));
    const citing = [...dirs.flatMap((d) => repoFiles(d, /\.(ts|mts|md|lua|mjs)$/)), 'README.md']
      .filter((f) => f !== self)
      .filter((f) => /DESIGN\.md|\.\.\/shared\//.test(readFileSync(join(root, f), 'utf8')));
    expect(citing).toEqual([]);
  });
});
