/**
 * A real regional agent in its own process (`regional-agent/main.ts`, standalone on a policies file), for tests
 * that need to freeze it (SIGSTOP) or talk to it from other processes.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import type { RedisServer } from '../harness/backend.js';
import { backend } from '../harness/fixtures.js';
import { freePort } from '../harness/ports.js';
import { eventually } from './wait.js';

export interface AgentProcess extends AsyncDisposable {
  readonly url: string;
  readonly child: ChildProcess;
  /** What the agent printed so far (for failure messages). */
  output(): string;
  /** Freeze the agent (SIGSTOP): connections are accepted by the kernel, nothing answers. */
  pause(): void;
  /** Thaw it (SIGCONT). */
  resume(): void;
}

export interface AgentProcessOptions {
  redisUrl: string;
  policies: Record<string, Record<string, unknown>>;
  env?: Record<string, string>;
}

export async function startAgentProcess(options: AgentProcessOptions): Promise<AgentProcess> {
  const dir = mkdtempSync(join(tmpdir(), 'qp-agent-'));
  const policiesFile = join(dir, 'policies.json');
  writeFileSync(policiesFile, JSON.stringify({ policies: options.policies }));
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', 'regional-agent/main.ts'], {
    env: {
      ...process.env,
      QP_REGION: 'us',
      QP_REDIS_URL: options.redisUrl,
      QP_POLICIES_FILE: policiesFile,
      QP_PORT: String(port),
      QP_LOG_LEVEL: 'warn',
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const url = `http://127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  let ready = false;
  // Ready, or exited: either ends the wait.
  await eventually(
    async () => {
      ready = (await fetch(`${url}/readyz`).catch(() => undefined))?.status === 200;
      return ready || child.exitCode !== null;
    },
    30_000,
    'the agent ready',
    100,
  ).catch(() => undefined);
  if (!ready) {
    await stop();
    throw new Error(`the agent did not become ready:\n${output}`);
  }
  return {
    url,
    child,
    output: () => output,
    pause: () => void child.kill('SIGSTOP'),
    resume: () => void child.kill('SIGCONT'),
    [Symbol.asyncDispose]: stop,
  };
}

/**
 * A test file's agent process on a Redis of the file's own (a test may freeze or stop either): both started before
 * the file's tests and stopped after them (the `beforeAll` and `afterAll` registered here). Read `agent` and
 * `redis` within the tests.
 */
export function agentProcessOnOwnRedis(options: Omit<AgentProcessOptions, 'redisUrl'>): {
  readonly agent: AgentProcess;
  readonly redis: RedisServer;
} {
  let redis: RedisServer | undefined;
  let agent: AgentProcess | undefined;
  beforeAll(async () => {
    redis = await backend().startRedis();
    agent = await startAgentProcess({ redisUrl: redis.url, ...options });
  }, 60_000);
  afterAll(async () => {
    await agent?.[Symbol.asyncDispose]();
    await redis?.[Symbol.asyncDispose]();
  });
  const started = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`${what} starts before the file's tests`);
    return value;
  };
  return {
    get agent() {
      return started(agent, 'the agent');
    },
    get redis() {
      return started(redis, 'Redis');
    },
  };
}
