/**
 * `npm run test:load` stopped from outside (a `timeout` around it, a cancelled CI job): it stops the stack it
 * started before it exits, so nothing it started is still running once it is gone.
 */
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { eventually } from '../../helpers/wait.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));

/** Every live descendant of `pid`, from /proc. */
function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const ppid = Number(readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1]!.split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const c of children.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

const cmdline = (pid: number): string => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
};

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('the load suite on SIGTERM', () => {
  it('stops the stack, then exits 143: none of the processes it started outlives it', async () => {
    const suite = spawn(
      process.execPath,
      ['--import', 'tsx', 'test/load/run.ts', '--short', '--only', 'ignoresRetryAfter'],
      { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    suite.stdout.on('data', (d: Buffer) => (out += d.toString()));
    suite.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => suite.once('exit', (code) => resolve(code)));
    try {
      // The table's header is printed once the stack is ready, as the scenario starts.
      await eventually(
        () => out.includes('| scenario |') || suite.exitCode !== null,
        120_000,
        'the suite',
        100,
      ).catch(() => undefined);
      if (!out.includes('| scenario |')) throw new Error(`the suite did not start:\n${out}`);
      // The stack: the launcher (scripts/stack.ts) and all it started (nats-server, three redis-servers, the
      // coordinator, three agents). Not tsx's esbuild service, which exits on its own once its parent is gone.
      const launcher = descendants(suite.pid!).find((pid) => cmdline(pid).includes('scripts/stack.ts'));
      expect(launcher, out).toBeDefined();
      const started = [launcher!, ...descendants(launcher!)];
      expect(started.length).toBeGreaterThanOrEqual(9);
      suite.kill('SIGTERM');
      const code = await Promise.race([
        exited,
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error(`no exit 60 s after SIGTERM:\n${out}`)), 60_000),
        ),
      ]);
      expect(code, out).toBe(143);
      expect(out).toContain('SIGTERM: stopping the stack');
      expect(started.filter(alive)).toEqual([]);
    } finally {
      if (suite.exitCode === null) suite.kill('SIGKILL');
    }
  }, 200_000);
});
