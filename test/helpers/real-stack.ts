/**
 * The stack as `npm start` starts it (scripts/stack.ts as a child process, real redis-server, nats-server,
 * coordinator and agents), every port chosen free by the launcher (port 0), for tests that load it from outside
 * as a user would. `await using` stops it with SIGTERM and waits for it to exit.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { StackState } from '../../scripts/stack/launcher.js';
import { STACK_PORT_VARS } from '../../scripts/stack/config.js';
import { eventually } from './wait.js';

const ROOT = new URL('../..', import.meta.url).pathname;

export interface RealStack extends AsyncDisposable {
  readonly state: StackState;
  readonly adminToken: string;
  /** Agent URL per region. */
  readonly agents: Readonly<Record<string, string>>;
  /** Pid of the launcher (its children are the stack's processes). */
  readonly pid: number;
  /** Call the admin API; throws on a status other than `expect`. */
  admin(method: string, path: string, body?: unknown, expect?: number): Promise<unknown>;
  /** Create a policy and wait until every agent decides it (a dry run answers 200). */
  createPolicy(name: string, body: Record<string, unknown>): Promise<void>;
  output(): string;
}

/**
 * Start the stack; resolves once it is ready (its state file exists). `env` adds to (or overrides) the defaults.
 * Aborting `signal` before then stops what was started and rejects.
 */
export async function startRealStack(
  env: Record<string, string> = {},
  readyMs = 180_000,
  signal?: AbortSignal,
): Promise<RealStack> {
  const dir = mkdtempSync(join(tmpdir(), 'qp-real-stack-'));
  const stateFile = join(dir, 'state.json');
  const adminToken = `load-admin-${Math.random().toString(36).slice(2)}-token`;
  const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/stack.ts'], {
    cwd: ROOT,
    env: {
      PATH: process.env['PATH'] ?? '',
      HOME: process.env['HOME'] ?? '/root',
      ...Object.fromEntries(STACK_PORT_VARS.map((v) => [v, '0'])),
      QP_STACK_SERVERS: 'binaries',
      QP_STACK_STATE_FILE: stateFile,
      QP_STACK_ENV_FILE: join(dir, 'stack.env'),
      QP_STACK_LOG_LEVEL: 'warn',
      QP_ADMIN_TOKEN: adminToken,
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  let exit: number | null | undefined;
  const exited = new Promise<void>((resolve) =>
    child.once('exit', (code) => {
      exit = code;
      resolve();
    }),
  );
  const stop = async () => {
    if (exit === undefined) child.kill('SIGTERM');
    await exited;
    rmSync(dir, { recursive: true, force: true });
  };
  // Ready, stopped or exited: any ends the wait.
  await eventually(
    () => existsSync(stateFile) || signal?.aborted === true || exit !== undefined,
    readyMs,
    'the stack ready',
    100,
  ).catch(() => undefined);
  if (!existsSync(stateFile)) {
    await stop();
    throw new Error(
      signal?.aborted === true
        ? 'the stack was stopped while it started'
        : `the stack did not become ready (exit ${String(exit)}):\n${out.slice(-4000)}`,
    );
  }
  const state = JSON.parse(readFileSync(stateFile, 'utf8')) as StackState;
  const admin = async (method: string, path: string, body?: unknown, expect = 200): Promise<unknown> => {
    const r = await fetch(`${state.coordinator}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${adminToken}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await r.text();
    if (r.status !== expect) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text === '' ? undefined : (JSON.parse(text) as unknown);
  };
  return {
    state,
    adminToken,
    agents: state.agents,
    pid: child.pid ?? 0,
    admin,
    output: () => out,
    async createPolicy(name, body) {
      await admin('PUT', `/v1/policies/${name}`, body, 201);
      const started = performance.now();
      for (const url of Object.values(state.agents)) {
        await eventually(
          async () => {
            const r = await fetch(`${url}/v1/decisions`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ policy: name, subject: 'probe', dryRun: true }),
            });
            const answer = (await r.json().catch(() => undefined)) as
              { results?: { reason?: string }[] } | undefined;
            // Known, and leased: a new policy's first decisions are `no_lease` until the agent's next renewal
            // (a round trip to the coordinator's region away on the geo topology).
            return r.status === 200 && answer?.results?.[0]?.reason !== 'no_lease';
          },
          // 30 s for all the agents together.
          Math.max(0, 30_000 - (performance.now() - started)),
          `${url} knows ${name}, leased`,
          100,
        );
      }
    },
    [Symbol.asyncDispose]: stop,
  };
}
