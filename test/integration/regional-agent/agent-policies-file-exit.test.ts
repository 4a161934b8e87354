/**
 * A policies file the agent cannot use is a configuration problem, as a bad QP_* setting is: the agent refuses
 * to start with exit code 2 and says what is wrong (docs/errors.md, AGT_POLICIES_INVALID), never exit 1 and a
 * stack trace, which a supervisor reads as a crash worth restarting.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { freePort } from '../../harness/ports.js';

async function start(policiesFile: string): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'regional-agent/main.ts'], {
    env: {
      ...process.env,
      QP_REGION: 'us',
      QP_REDIS_URL: inject('redis').url,
      QP_POLICIES_FILE: policiesFile,
      QP_PORT: String(await freePort()),
      QP_LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  return { code, stderr };
}

describe('an agent started with a policies file it cannot use', () => {
  it('exits 2 naming the problem: an invalid policy, a missing file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'qp-policies-exit-'));
    try {
      const bad = join(dir, 'bad.json');
      writeFileSync(bad, JSON.stringify({ policies: { demo: { capacity: -1, refillPerSecond: 1 } } }));
      const invalid = await start(bad);
      expect(invalid.code, invalid.stderr).toBe(2);
      expect(invalid.stderr).toContain('capacity');
      expect(invalid.stderr).not.toContain('    at ');
      const missing = await start(join(dir, 'missing.json'));
      expect(missing.code, missing.stderr).toBe(2);
      expect(missing.stderr).toContain('missing.json');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
