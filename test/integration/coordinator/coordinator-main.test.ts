/**
 * `coordinator/main.ts` as an operator runs it: configuration errors listed with exit status 2; with a good
 * environment it listens, serves, and exits 0 on SIGTERM.
 */
import { spawn } from 'node:child_process';
import { describe, expect, inject, it } from 'vitest';
import { freePort } from '../../harness/ports.js';
import { ADMIN_TOKEN, eventually, uniqueNamespace } from '../../helpers/coordinator-fixture.js';

interface Run {
  readonly exited: Promise<number | null>;
  output(): string;
  kill(signal: NodeJS.Signals): void;
}

function runMain(env: Record<string, string>): Run {
  const child = spawn(process.execPath, ['--import', 'tsx', 'coordinator/main.ts'], {
    cwd: new URL('../../..', import.meta.url).pathname,
    env: { PATH: process.env['PATH'] ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { exited, output: () => out, kill: (s) => child.kill(s) };
}

// Spawning `tsx` compiles the service first: allow for a loaded machine (15 s to ready was missed at a load
// average above 20 on two cores).
describe('coordinator main', { timeout: 90_000 }, () => {
  it('lists every configuration problem and exits with status 2', async () => {
    const run = runMain({ QP_ADMIN_TOKEN: 'short', QP_PORT: 'x' });
    expect(await run.exited).toBe(2);
    const text = run.output();
    expect(text).toContain('invalid coordinator configuration');
    expect(text).toContain('QP_REGIONS');
    expect(text).toContain('QP_ADMIN_TOKEN');
    expect(text).toContain('QP_PORT');
    expect(text).not.toContain('short');
  });

  it('listens with a good environment and shuts down cleanly on SIGTERM', async () => {
    const port = await freePort();
    const run = runMain({
      QP_NATS_URL: inject('nats').url,
      QP_REGIONS: 'us,eu',
      QP_ADMIN_TOKEN: ADMIN_TOKEN,
      QP_PORT: String(port),
      QP_KV_NAMESPACE: uniqueNamespace(),
      QP_LOG_LEVEL: 'warn',
    });
    try {
      await eventually(
        async () => (await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined))?.status === 200,
        60_000,
        'the coordinator process becomes ready',
      );
      const r = await fetch(`http://127.0.0.1:${port}/v1/policies/demo`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ capacity: 5, refillPerSecond: 1 }),
      });
      expect(r.status).toBe(201);
    } finally {
      run.kill('SIGTERM');
    }
    expect(await run.exited).toBe(0);
    expect(run.output()).not.toContain(ADMIN_TOKEN);
  });
});
