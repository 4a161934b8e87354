/**
 * The integration tests use `@quotaplane/client` as services do, through its built `dist/` (the root `npm ci`
 * builds it). When its sources (or core's, which it bundles) are newer than the build, build it again first, so
 * a test never runs a stale client.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';

const repo = resolve(import.meta.dirname, '../..');
const pkg = join(repo, 'packages', 'client');

function mtimes(dir: string): number[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => statSync(join(e.parentPath, e.name)).mtimeMs);
}

export function clientBuildIsStale(): boolean {
  const built = mtimes(join(pkg, 'dist'));
  if (built.length === 0) return true;
  const sources = [
    ...mtimes(join(pkg, 'src')),
    ...mtimes(join(repo, 'core')),
    statSync(join(pkg, 'package.json')).mtimeMs,
    statSync(join(pkg, 'tsdown.config.ts')).mtimeMs,
  ];
  return Math.max(...sources) > Math.min(...built);
}

export function ensureClientBuilt(): void {
  if (!clientBuildIsStale()) return;
  execFileSync('npm', ['run', 'build', '--workspace', '@quotaplane/client'], {
    cwd: repo,
    stdio: 'pipe',
    timeout: 120_000,
  });
}
