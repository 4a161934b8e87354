/**
 * The coordinator and the regional agent never import each other (eslint.config.mjs forbids it): what both need
 * is in core/ (pure) or common/ (I/O), and common/ imports neither. This scans every import of the three folders,
 * so the boundary holds even where the lint rule is not run. Inside the agent, borrowing reaches the decision
 * path only through its port.
 */
import { readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT, repoFiles } from '../../helpers/repo-files.js';

/** Root-relative paths of the relative imports in `file`. */
function importsOf(file: string): string[] {
  const text = readFileSync(join(REPO_ROOT, file), 'utf8');
  return [...text.matchAll(/^(?:import|export)\b[^;]*?from '(\.[^']+)'/gms)].map((m) =>
    relative(REPO_ROOT, join(REPO_ROOT, dirname(file), m[1]!)),
  );
}

const forbidden: Record<'coordinator' | 'regional-agent' | 'common', readonly string[]> = {
  coordinator: ['regional-agent/'],
  'regional-agent': ['coordinator/'],
  common: ['coordinator/', 'regional-agent/'],
};

describe('service boundary', () => {
  for (const [dir, others] of Object.entries(forbidden)) {
    it(`${dir}/ imports nothing from ${others.join(' or ')}`, () => {
      const files = repoFiles(dir, /\.ts$/);
      expect(files.length).toBeGreaterThan(0);
      const crossing = files.flatMap((file) =>
        importsOf(file)
          .filter((target) => others.some((other) => target.startsWith(other)))
          .map((target) => `${file} -> ${target}`),
      );
      expect(crossing).toEqual([]);
    });
  }

  it('the scan sees imports: the agent and the coordinator both use the KV watch loop from common/', () => {
    expect(importsOf('coordinator/nats/kv-guard.ts')).toContain('common/nats/kv-watch-loop.js');
    expect(importsOf('regional-agent/leases/lease-holder.ts')).toContain('common/nats/kv-watch-loop.js');
  });
});

describe('borrowing behind its port', () => {
  it('regional-agent/borrowing/ reaches the decision path only through decisions/borrowing-port.ts', () => {
    const files = repoFiles('regional-agent/borrowing', /\.ts$/);
    const reached = files.flatMap((file) =>
      importsOf(file).filter((target) => target.startsWith('regional-agent/decisions/')),
    );
    // The borrower implements the port: the scan sees that import, and no other into the decision path.
    expect(reached).toContain('regional-agent/decisions/borrowing-port.js');
    expect(reached.filter((target) => target !== 'regional-agent/decisions/borrowing-port.js')).toEqual([]);
  });
});
