/** The repository's own files, for tests that scan source and docs (error codes, links, copied rules). */
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/** The repository's root directory. */
export const REPO_ROOT = join(import.meta.dirname, '..', '..');

/** The folders that hold the services' and tools' TypeScript: every test that scans source starts from these. */
export const CODE_DIRS = ['core', 'regional-agent', 'coordinator', 'common', 'cli', 'simulations'] as const;

const SKIPPED = new Set(['node_modules', 'dist', '.git']);

/** Files under `dir` (relative to the root) whose names match `name`, as root-relative paths; none if absent. */
export function repoFiles(dir: string, name: RegExp): string[] {
  if (!existsSync(join(REPO_ROOT, dir))) return [];
  return readdirSync(join(REPO_ROOT, dir), { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return SKIPPED.has(entry.name) ? [] : repoFiles(path, name);
    return name.test(entry.name) ? [path] : [];
  });
}
