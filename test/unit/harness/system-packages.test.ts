/**
 * The test setup's package check (test/harness/system-packages.ts), with apt-get and the binary lookup stood in
 * for: it installs what is missing in one apt-get update and one install, as `.ci/run` does, says so, and when it
 * cannot it answers each missing package with the reason and the line that installs it.
 */
import { describe, expect, it } from 'vitest';
import {
  ensureSystemPackages,
  INSTALL_LINE,
  missingReason,
  SYSTEM_PACKAGES,
  type SystemPackage,
} from '../../harness/system-packages.js';

function machine(installed: string[], aptFails?: 'update' | 'install') {
  const present = new Set(installed);
  const calls: string[][] = [];
  const lines: string[] = [];
  return {
    calls,
    lines,
    find: (p: SystemPackage) => (present.has(p.name) ? `/usr/bin/${p.binary}` : undefined),
    apt: (args: readonly string[]) => {
      calls.push([...args]);
      if (args[0] === aptFails) return Promise.reject(new Error(`E: Unable to ${args[0]}`));
      if (args[0] === 'install') for (const a of args.slice(1)) if (!a.startsWith('-')) present.add(a);
      return Promise.resolve();
    },
    say: (line: string) => lines.push(line),
  };
}

const servers = ['redis-server', 'redis-tools', 'nats-server'];

describe('system packages for the tests', () => {
  it('names every package in one install line', () => {
    expect(SYSTEM_PACKAGES.map((p) => p.name)).toEqual([...servers, 'chromium', 'nginx']);
    expect(INSTALL_LINE).toBe(
      'sudo apt-get update && sudo apt-get install -y redis-server redis-tools nats-server chromium nginx',
    );
  });

  it('does nothing when everything is installed', async () => {
    const m = machine([...servers, 'chromium', 'nginx']);
    expect(await ensureSystemPackages({ ...m, root: true, install: true })).toEqual([]);
    expect(m.calls).toEqual([]);
    expect(m.lines).toEqual([]);
  });

  it('installs what is missing as root, in one update and one install, and says so', async () => {
    const m = machine(servers);
    expect(await ensureSystemPackages({ ...m, root: true, install: true })).toEqual([]);
    expect(m.calls).toEqual([
      ['update', '-qq'],
      ['install', '-y', '-qq', 'chromium', 'nginx'],
    ]);
    expect(m.lines[0]).toMatch(/^missing: chromium nginx; installing as \.ci\/run does/);
    expect(m.lines[1]).toMatch(/^installed chromium nginx in \d+ s$/);
  });

  it('when it cannot install, answers each missing package with the reason and says what to run', async () => {
    for (const [options, why] of [
      [{ root: false, install: true }, 'not root, so it cannot run apt-get'],
      [{ root: true, install: false }, 'QP_TEST_INSTALL=0'],
      [{ root: true, install: true, fails: 'update' as const }, 'apt-get update failed: E: Unable to update'],
      [
        { root: true, install: true, fails: 'install' as const },
        'apt-get install failed: E: Unable to install',
      ],
    ] as const) {
      const m = machine(servers, 'fails' in options ? options.fails : undefined);
      const missing = await ensureSystemPackages({ ...m, root: options.root, install: options.install });
      expect(missing.map((x) => x.name)).toEqual(['chromium', 'nginx']);
      expect(missingReason(missing, 'chromium')).toBe(
        `chromium is not installed and the test setup did not install it (${why}); install it with: sudo apt-get install -y chromium`,
      );
      expect(missingReason(missing, 'redis-server')).toBeUndefined();
      expect(m.lines).toContain(
        `chromium is missing (test/integration/coordinator/http/dashboard-browser.test.ts needs it): ${why}`,
      );
      expect(m.lines.at(-1)).toBe(`install what the tests need with: ${INSTALL_LINE}`);
    }
  });
});
