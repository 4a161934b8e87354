/**
 * The stack a replay runs against. Either `npm start`'s launcher (scripts/stack.ts) as a child process, in its own
 * process group, on free loopback ports (unless the environment moves them), without the demo policy, with the
 * replay's protocol timers, and its output in a log file; or a stack already running, named by the state file its
 * launcher wrote (`QP_STACK_STATE_FILE`). A started stack is stopped by SIGTERM to the launcher, which stops its
 * processes in order and frees every port; the launcher also stops everything if this process dies.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { ownRecord, ownValue, setOwn } from '../../core/own-keys.js';
import { STACK_PORT_VARS, STACK_REGIONS } from '../../scripts/stack/config.js';
import { SimConfigError } from '../errors.js';
import { ReplayError, ReplayInterrupted } from './replay-errors.js';

/** Where the replay talks to the stack. Arrays are by region index (us, eu, ap). */
export interface StackEndpoints {
  coordinator: string;
  agents: string[];
  /** `redis://host:port` of each region's Redis; undefined for a region on a Redis Cluster. */
  redis: (string | undefined)[];
  adminToken: string;
  /** Bearer token for reads (the admin token when no read token is known). */
  readToken: string;
}

export interface StackSession {
  readonly kind: 'started' | 'attached';
  readonly endpoints: StackEndpoints;
  /** Where the launcher's output went (started stacks). */
  readonly logFile: string | undefined;
  /** Resolves with a description when the stack stops on its own (never for an attached stack). */
  readonly died: Promise<string>;
  /** Stop what was started (nothing for an attached stack); safe to call twice. */
  stop(): Promise<void>;
}

/** The part of the launcher's state file the replay reads (scripts/stack/launcher.ts StackState). */
const StateFile = z.object({
  coordinator: z.url(),
  agents: ownRecord(z.string(), z.url()),
  redis: ownRecord(z.string(), z.string()),
});

/** How long a started stack may take to be ready before the replay gives up (the launcher waits 90 s per service). */
const READY_TIMEOUT_MS = 240_000;
/** How long the launcher may take to stop in order before it is told again (then it kills everything). */
const STOP_TIMEOUT_MS = 45_000;

/** The environment variables of the caller that would fight the replay's own; listed in one error. */
export function conflictingEnv(
  env: Readonly<Record<string, string | undefined>>,
  reserved: readonly string[],
): void {
  const set = reserved.filter((name) => (ownValue(env, name) ?? '') !== '');
  if (set.length > 0)
    throw new SimConfigError(
      `--real-stack sets ${set.join(', ')} itself (from --compress and the settings): unset ${set.length === 1 ? 'it' : 'them'} or use --set`,
    );
}

function tail(file: string, lines = 25): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no output)';
  }
}

function endpointsFrom(
  state: z.infer<typeof StateFile>,
  adminToken: string,
  readToken: string | undefined,
): StackEndpoints {
  const missing = STACK_REGIONS.filter((r) => state.agents[r] === undefined);
  if (missing.length > 0)
    throw new ReplayError(
      `the stack has no agent for ${missing.join(', ')} (the replay needs ${STACK_REGIONS.join(', ')})`,
    );
  return {
    coordinator: state.coordinator,
    agents: STACK_REGIONS.map((r) => state.agents[r]!),
    redis: STACK_REGIONS.map((r) => {
      const target = state.redis[r];
      return target !== undefined && target.startsWith('redis://') ? target : undefined;
    }),
    adminToken,
    readToken: readToken ?? adminToken,
  };
}

function exitText(code: number | null, signal: NodeJS.Signals | null): string {
  return signal !== null ? `signal ${signal}` : `code ${String(code)}`;
}

export interface StartOptions {
  /** The repository root (scripts/stack.ts runs from source there). */
  root: string;
  /** The caller's environment; the launcher inherits it with the replay's variables on top. */
  env: Readonly<Record<string, string | undefined>>;
  /** `QP_COORDINATOR_*` / `QP_AGENT_*` variables of the plan. */
  stackEnv: Readonly<Record<string, string>>;
  logFile: string;
  stateFile: string;
  signal: AbortSignal;
}

/** Start the stack and wait until every agent is ready; throws ReplayError with the launcher's last lines. */
export async function startStack(o: StartOptions): Promise<StackSession> {
  const adminToken = o.env['QP_ADMIN_TOKEN'] || randomBytes(24).toString('hex');
  const readToken = o.env['QP_READ_TOKEN'] || undefined;
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(o.env)) if (v !== undefined) setOwn(env, k, v);
  // Unset ports get 0 (any free port), so a replay never meets a stack on 7100.
  for (const name of STACK_PORT_VARS) if ((ownValue(env, name) ?? '') === '') setOwn(env, name, '0');
  Object.assign(env, o.stackEnv, {
    QP_ADMIN_TOKEN: adminToken,
    QP_STACK_SEED: 'false',
    QP_STACK_STATE_FILE: o.stateFile,
    // Beside the state file, not in the directory it runs in, where a stack of the reader's may have its own.
    QP_STACK_ENV_FILE: join(dirname(o.stateFile), 'stack.env'),
  });

  const log = openSync(o.logFile, 'a');
  let child: ChildProcess;
  try {
    child = spawn(process.execPath, ['--import', 'tsx', 'scripts/stack.ts'], {
      cwd: o.root,
      env,
      detached: true,
      stdio: ['ignore', log, log],
    });
  } finally {
    closeSync(log);
  }
  let exit: string | undefined;
  let onExit: (text: string) => void = () => undefined;
  const exited = new Promise<string>((resolve) => (onExit = resolve));
  child.once('error', (error) => {
    exit ??= `could not run ${process.execPath}: ${error.message}`;
    onExit(exit);
  });
  child.once('exit', (code, signal) => {
    exit ??= `the launcher exited (${exitText(code, signal)})`;
    onExit(exit);
  });

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      if (exit !== undefined || child.pid === undefined) return;
      const send = (s: NodeJS.Signals) => {
        try {
          process.kill(child.pid!, s);
        } catch {
          // already gone
        }
      };
      // The timer is cancelled once the launcher has exited: a pending one would hold the CLI's exit up.
      const exitedWithin = async (ms: number): Promise<boolean> => {
        const timer = new AbortController();
        try {
          return await Promise.race([exited.then(() => true), sleep(ms, false, { signal: timer.signal })]);
        } finally {
          timer.abort();
        }
      };
      send('SIGTERM');
      if (await exitedWithin(STOP_TIMEOUT_MS)) return;
      // A second signal more than two seconds after the first makes the launcher kill every process at once.
      send('SIGTERM');
      if (await exitedWithin(10_000)) return;
      send('SIGKILL');
      await exited;
    })());

  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    if (exit !== undefined)
      throw new ReplayError(
        `the stack did not start: ${exit}; its last lines (${o.logFile}):\n${tail(o.logFile)}`,
      );
    if (o.signal.aborted) {
      await stop();
      throw new ReplayInterrupted(String(o.signal.reason ?? 'interrupted'));
    }
    if (existsSync(o.stateFile)) break;
    if (Date.now() > deadline) {
      await stop();
      throw new ReplayError(
        `the stack was not ready within ${READY_TIMEOUT_MS / 1000} s; its last lines (${o.logFile}):\n${tail(o.logFile)}`,
      );
    }
    await sleep(100);
  }
  let endpoints: StackEndpoints;
  try {
    endpoints = endpointsFrom(
      StateFile.parse(JSON.parse(readFileSync(o.stateFile, 'utf8'))),
      adminToken,
      readToken,
    );
  } catch (error) {
    await stop();
    throw new ReplayError(`the stack's state file ${o.stateFile} is unreadable: ${String(error)}`);
  }
  return {
    kind: 'started',
    endpoints,
    logFile: o.logFile,
    died: exited.then((text) => `${text}; its last lines (${o.logFile}):\n${tail(o.logFile)}`),
    stop,
  };
}

/** A running stack from its launcher's state file; the admin token comes from QP_ADMIN_TOKEN. */
export async function attachStack(
  stateFile: string,
  env: Readonly<Record<string, string | undefined>>,
): Promise<StackSession> {
  const adminToken = env['QP_ADMIN_TOKEN'];
  if (adminToken === undefined || adminToken === '')
    throw new SimConfigError("--attach needs the stack's admin token in QP_ADMIN_TOKEN");
  let state;
  try {
    state = StateFile.parse(JSON.parse(readFileSync(stateFile, 'utf8')));
  } catch (error) {
    throw new SimConfigError(
      `--attach ${stateFile}: not a stack state file (${error instanceof Error ? error.message : String(error)})`,
    );
  }
  const endpoints = endpointsFrom(state, adminToken, env['QP_READ_TOKEN'] || undefined);
  try {
    const r = await fetch(`${endpoints.coordinator}/readyz`, { signal: AbortSignal.timeout(3000) });
    await r.body?.cancel();
    if (r.status !== 200) throw new Error(`/readyz answered ${r.status}`);
  } catch (error) {
    throw new ReplayError(
      `cannot reach a ready coordinator at ${endpoints.coordinator}: ${error instanceof Error ? error.message : String(error)}`,
    );
  }
  return {
    kind: 'attached',
    endpoints,
    logFile: undefined,
    died: new Promise<string>(() => undefined),
    stop: () => Promise.resolve(),
  };
}
