/**
 * The documented examples, run as written against `npm start`: every ```sh block of README.md and docs/*.md runs
 * in bash (`set -euo pipefail`, one shell per file, blocks in order, so a block may use what an earlier one set)
 * against a real stack started by scripts/stack.ts with its tokens generated, as a reader's plain `npm start`
 * does: the blocks get them, and the CLI its address, from the file the stack writes and the docs `source`
 * (nothing else is exported to them). Every curl must get an answer below 400, every other command must
 * succeed, and where the docs show a command's output in a comment, the fields shown must be what it printed
 * (test/helpers/doc-outputs.ts; `… ` elides, `# e.g.` marks an illustration). Between files the demo policy and
 * the regions' Redis are put back as the stack started them, so each file starts from what its reader sees
 * after `npm start`. Two things differ from a reader's terminal, both because the machine is shared: the stack
 * listens on free ports, so the default addresses in the text (127.0.0.1:7100-7103, localhost:…) are rewritten
 * to the ports it got, and its file of tokens is written in the test's directory, so `.quotaplane/stack.env` is
 * rewritten to it. A block that is not a command against the stack (installing, starting a stack of its own,
 * Docker, the simulator) says so in a `<!-- example: skip (why) -->` line above it (the last non-blank line
 * before the fence).
 */
import { spawn } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StackState } from '../../../scripts/stack/launcher.js';
import { DEMO_POLICY } from '../../../scripts/stack/seed.js';
import { freePort } from '../../harness/ports.js';
import { DEFAULT_ENV_FILE, STACK_PORT_VARS } from '../../../scripts/stack/config.js';
import { instrument, mismatch, parseDocumented, printed } from '../../helpers/doc-outputs.js';
import { eventually } from '../../helpers/wait.js';

const ROOT = new URL('../../../', import.meta.url).pathname;

interface Block {
  file: string;
  line: number;
  code: string;
  skip: string | undefined;
}

/** Every ```sh block of the README and docs/, with the skip reason written above it, if any. */
function blocks(): Block[] {
  const files = [
    'README.md',
    ...readdirSync(join(ROOT, 'docs'))
      .filter((f) => f.endsWith('.md'))
      .sort()
      .map((f) => `docs/${f}`),
  ];
  const out: Block[] = [];
  for (const file of files) {
    const lines = readFileSync(join(ROOT, file), 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      if (lines[i] !== '```sh') continue;
      const end = lines.indexOf('```', i + 1);
      // The marker is the last non-blank line above the fence (prettier keeps a blank line between them).
      let j = i - 1;
      while (j >= 0 && lines[j]!.trim() === '') j--;
      const above = j >= 0 ? lines[j]! : '';
      const skip = /^<!-- example: skip \((.+)\) -->$/.exec(above)?.[1];
      out.push({ file, line: i + 1, code: lines.slice(i + 1, end).join('\n'), skip });
      i = end;
    }
  }
  return out;
}

const all = blocks();
const byFile = new Map<string, Block[]>();
for (const b of all.filter((b) => b.skip === undefined))
  byFile.set(b.file, [...(byFile.get(b.file) ?? []), b]);

let state: StackState;
let launcher: ReturnType<typeof spawn> | undefined;
let scratch: string;
let envFile: string;
let output = '';

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'qp-docs-'));
  const stateFile = join(scratch, 'state.json');
  envFile = join(scratch, 'stack.env');
  // No tokens given: the stack generates them, as for a reader's `npm start`.
  const env: Record<string, string> = {
    PATH: process.env['PATH'] ?? '',
    HOME: process.env['HOME'] ?? '/root',
    QP_STACK_SERVERS: 'binaries',
    QP_STACK_STATE_FILE: stateFile,
    QP_STACK_ENV_FILE: envFile,
  };
  const taken = new Set<number>();
  for (const name of STACK_PORT_VARS) {
    let port = await freePort();
    while (taken.has(port)) port = await freePort();
    taken.add(port);
    env[name] = String(port);
  }
  launcher = spawn(process.execPath, ['--import', 'tsx', 'scripts/stack.ts'], {
    cwd: ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  launcher.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  launcher.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  // Ready or exited: either ends the wait.
  await eventually(
    () => existsSync(stateFile) || launcher!.exitCode !== null,
    150_000,
    'the stack',
    200,
  ).catch(() => undefined);
  if (!existsSync(stateFile)) {
    if (launcher.exitCode !== null) throw new Error(`the stack exited (${launcher.exitCode}):\n${output}`);
    throw new Error(`the stack was not ready in time:\n${output}`);
  }
  state = JSON.parse(readFileSync(stateFile, 'utf8')) as StackState;
  // A shim in front of curl notes each answer's status on stderr, where the examples' output does not go.
  writeFileSync(
    join(scratch, 'curl'),
    `#!/bin/sh\nexec /usr/bin/curl -w '%{stderr}QP-EXAMPLE-STATUS %{http_code} %{method} %{url_effective}\\n' "$@"\n`,
  );
  chmodSync(join(scratch, 'curl'), 0o755);
}, 180_000);

afterAll(async () => {
  if (launcher !== undefined && launcher.exitCode === null) {
    const exited = new Promise((r) => launcher!.once('exit', r));
    launcher.kill('SIGTERM');
    await exited;
  }
  rmSync(join(ROOT, 'headers.txt'), { force: true });
  if (scratch !== undefined) rmSync(scratch, { recursive: true, force: true });
}, 60_000);

/** The stack's default addresses in the text moved to the ports this stack got, its env file to where it is. */
function rewrite(code: string): string {
  const port = (url: string) => new URL(url).port;
  const ports: Record<string, string> = {
    '7100': port(state.coordinator),
    '7101': port(state.agents['us']!),
    '7102': port(state.agents['eu']!),
    '7103': port(state.agents['ap']!),
  };
  return code
    .replace(
      /\b(localhost|127\.0\.0\.1):(710[0-3])\b/g,
      (_, host: string, p: string) => `${host}:${ports[p]!}`,
    )
    .split(DEFAULT_ENV_FILE)
    .join(envFile);
}

/** The stack's admin token, from its env file (as the docs read it). */
function adminToken(): string {
  const token = /^export QP_ADMIN_TOKEN='([^']+)'$/m.exec(readFileSync(envFile, 'utf8'))?.[1];
  if (token === undefined) throw new Error(`no admin token in ${envFile}`);
  return token;
}

/**
 * The demo policy and every region's Redis as the stack started them: the seeded budget back in force at every
 * agent (a dry run sees the limit of a third of it) and no bucket left by an earlier file.
 */
async function resetStack(): Promise<void> {
  const res = await fetch(`${state.coordinator}/v1/policies/${DEMO_POLICY.name}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${adminToken()}`, 'content-type': 'application/json' },
    body: JSON.stringify({ capacity: DEMO_POLICY.capacity, refillPerSecond: DEMO_POLICY.refillPerSecond }),
  });
  expect(res.status, await res.text()).toBeLessThan(300);
  const third = Math.floor(DEMO_POLICY.capacity / 3);
  for (const url of Object.values(state.agents)) {
    await eventually(
      async () => {
        const r = await fetch(`${url}/v1/decisions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ policy: DEMO_POLICY.name, subject: 'docs-reset', dryRun: true }),
        });
        const body = (await r.json()) as { results?: { limit?: number }[] };
        return body.results?.[0]?.limit === third;
      },
      15_000,
      `${url} enforces the seeded demo budget again`,
    );
  }
  for (const target of Object.values(state.redis)) {
    if (target.startsWith('cluster ')) throw new Error('the docs run against single-Redis regions');
    const redis = new Redis(target);
    try {
      await redis.flushall();
    } finally {
      redis.disconnect();
    }
  }
}

/**
 * Run `script` in bash and resolve its exit status (null when it was killed at `timeoutMs`) and output. Not
 * spawnSync: a file's blocks can take minutes on a loaded machine (every `npx quotaplane` starts node and
 * compiles the CLI), and a blocked event loop never sees the stack close an idle keep-alive connection, so the
 * next fetch of that connection failed with "other side closed". The script runs in its own process group, all
 * of it killed at the timeout.
 */
function runScript(
  script: string,
  env: Record<string, string>,
  timeoutMs: number,
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-c', script], {
      cwd: ROOT,
      env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // already gone
      }
    }, timeoutMs);
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ status: code, stdout, stderr });
    });
  });
}

describe('documented examples', () => {
  it('every block that is not run says why', () => {
    const skipped = all.filter((b) => b.skip !== undefined);
    for (const b of skipped) expect(b.skip!.length, `${b.file}:${b.line}`).toBeGreaterThan(10);
    // Most of what the docs show an operator is run: the blocks against the stack outnumber the rest.
    expect(all.length - skipped.length).toBeGreaterThanOrEqual(10);
  });

  it.each([...byFile.keys()])(
    '%s runs as written against the stack, and prints what it shows',
    async (file) => {
      await resetStack();
      const outputs: { id: number; line: number; text: string }[] = [];
      const script = [
        'set -euo pipefail',
        ...byFile.get(file)!.map((b) => {
          const marked = instrument(rewrite(b.code), b.line, outputs.length + 1);
          outputs.push(...marked.outputs);
          return `# ${b.file}:${b.line}\n${marked.code}`;
        }),
      ].join('\n');
      // docs/cli.md alone starts `npx quotaplane` seven times: past 120 s at a load average above 20.
      const run = await runScript(
        script,
        { PATH: `${scratch}:${process.env['PATH'] ?? ''}`, HOME: process.env['HOME'] ?? '/root' },
        300_000,
      );
      const statuses = [...run.stderr.matchAll(/^QP-EXAMPLE-STATUS (\d+) (\S+) (\S+)$/gm)].map((m) => ({
        status: Number(m[1]),
        request: `${m[2]} ${m[3]}`,
      }));
      const context = `${file}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
      expect(run.status, context).toBe(0);
      expect(
        statuses.filter((s) => s.status >= 400 || s.status === 0),
        context,
      ).toEqual([]);
      const curls = byFile.get(file)!.reduce((n, b) => n + (b.code.match(/^\s*curl /gm)?.length ?? 0), 0);
      expect(statuses.length, context).toBe(curls);
      const got = printed(run.stdout);
      for (const o of outputs) {
        const where = `${file}:${o.line}`;
        const shown = parseDocumented(o.text);
        expect(got.has(o.id), `${where}: the command printed nothing\n${context}`).toBe(true);
        expect(
          mismatch(JSON.parse(got.get(o.id)!) as unknown, shown),
          `${where}: ${got.get(o.id)}`,
        ).toBeUndefined();
      }
    },
    360_000,
  );

  it('compares the outputs the README and the docs show', () => {
    const shown = [...byFile.values()].flat().flatMap((b) => instrument(b.code, b.line, 1).outputs);
    // The README's first decision, the stack's, the policy answers and the budget change at least.
    expect(shown.length).toBeGreaterThanOrEqual(5);
    for (const o of shown) expect(() => parseDocumented(o.text), o.text).not.toThrow();
  });
});
