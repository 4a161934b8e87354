/**
 * `npm start` as a user runs it: `scripts/stack.ts` as a child process on alternative ports (every port moved by
 * its variable), real redis-server and nats-server from PATH, the real coordinator and agents. Decisions go
 * through each region's agent, a budget PATCH through the admin API reaches every agent, and SIGTERM leaves no
 * process and no port behind. Failures: a process dying, a signal during the start, a taken port, no servers,
 * a bad environment.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { freePort } from '../../../harness/ports.js';
import { STACK_PORT_VARS } from '../../../../scripts/stack/config.js';
import type { StackState } from '../../../../scripts/stack/launcher.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';
import { rlsClient } from '../../../../regional-agent/grpc/rls-client.js';
import { natsCredentials } from '../../../../regional-agent/nats/credentials.js';
import { protocolSubjects } from '../../../../core/wire/protocol.js';
import { connect } from '@nats-io/transport-node';
import { carryingId, leftovers, portsOf, takenOf, uptimeSeconds } from '../../../helpers/stack-state.js';
import { within } from '../../../helpers/within.js';
import { eventually as poll } from '../../../helpers/wait.js';

const ROOT = new URL('../../../..', import.meta.url).pathname;
const ADMIN_TOKEN = 'stack-admin-token-0123456789';

interface Run {
  readonly pid: number;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
  signal(signal: NodeJS.Signals): void;
}

const runs: Run[] = [];
const dirs: string[] = [];

/**
 * The launcher runs niced (its children inherit it): four services compiling and starting at once would
 * otherwise take the machine's two cores from tests with tight deadlines running beside this file.
 */
const NICE = existsSync('/usr/bin/nice');

function launch(env: Record<string, string>): Run {
  const command = NICE ? '/usr/bin/nice' : process.execPath;
  const args = [...(NICE ? ['-n', '10', process.execPath] : []), '--import', 'tsx', 'scripts/stack.ts'];
  const child = spawn(command, args, {
    cwd: ROOT,
    env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? '/root', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  const run: Run = { pid: child.pid!, exited, output: () => out, signal: (s) => child.kill(s) };
  runs.push(run);
  return run;
}

// A test that failed half-way must not leave a stack running for the next one.
afterEach(async () => {
  for (const run of runs.splice(0)) {
    run.signal('SIGTERM');
    await run.exited;
  }
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), 'qp-stack-test-'));
  dirs.push(dir);
  return dir;
}

/** Every 100 ms: the probes read /proc and try ports. */
const eventually = (probe: () => Promise<boolean> | boolean, ms: number, what: string) =>
  poll(probe, ms, what, 100);

/**
 * Every port the launcher may use, moved off the defaults; the eu region on a cluster and the ap region under
 * Sentinel, both on ports picked by the launcher.
 */
async function stackEnv(dir: string): Promise<Record<string, string>> {
  const names = STACK_PORT_VARS.filter(
    (name) => name !== 'QP_STACK_EU_REDIS_PORT' && name !== 'QP_STACK_AP_REDIS_PORT',
  );
  const env: Record<string, string> = {
    QP_STACK_EU_REDIS_PORT: '0',
    QP_STACK_AP_REDIS_PORT: '0',
    QP_STACK_CLUSTER_REGIONS: 'eu',
    QP_STACK_SENTINEL_REGIONS: 'ap',
    QP_STACK_SERVERS: 'binaries',
    QP_STACK_STATE_FILE: join(dir, 'state.json'),
    QP_STACK_SECRETS_DIR: join(dir, 'secrets'),
    QP_STACK_ENV_FILE: join(dir, 'env', 'stack.env'),
    QP_ADMIN_TOKEN: ADMIN_TOKEN,
  };
  const ports = new Set<number>();
  for (const name of names) {
    let port = await freePort();
    while (ports.has(port)) port = await freePort();
    ports.add(port);
    env[name] = String(port);
  }
  return env;
}

/** Every port fixed (no cluster picked by the launcher), so every server can be checked gone by its port. */
async function fixedPortsEnv(dir: string): Promise<Record<string, string>> {
  const env = await stackEnv(dir);
  // Not one of stackEnv's ports: the launcher refuses a port asked for twice (exit 2, before it starts anything).
  const taken = new Set(Object.values(env));
  let port = await freePort();
  while (taken.has(String(port))) port = await freePort();
  return { ...env, QP_STACK_CLUSTER_REGIONS: '', QP_STACK_EU_REDIS_PORT: String(port) };
}

/**
 * How long the launcher may take to start the stack: it runs niced (see NICE), so on a machine whose cores
 * other files keep busy it waits for them.
 */
const START_MS = 150_000;

/** The launcher's last line of output, for the first line of an error (all a CI summary keeps). */
function lastLine(run: Run): string {
  const lines = run
    .output()
    .split('\n')
    .filter((l) => l.trim() !== '');
  return lines.length === 0 ? ', no output' : `, last line: ${JSON.stringify(lines.at(-1)!.trim())}`;
}

/**
 * Poll `probe` until it is true; fails at once if the launcher exits first, and after `ms`, either way with the
 * launcher's output so far.
 */
async function whileRunning(run: Run, probe: () => boolean, ms: number, what: string): Promise<void> {
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  void run.exited.then((e) => (exit = e));
  const started = performance.now();
  await eventually(
    () => {
      if (exit !== undefined) {
        const how = exit.signal !== null ? `signal ${exit.signal}` : `code ${exit.code}`;
        throw new Error(
          `the launcher exited (${how}) after ${Math.round(performance.now() - started)} ms, before ${what}${lastLine(run)}; its output:\n${run.output()}`,
        );
      }
      return probe();
    },
    ms,
    what,
  ).catch((error: Error) => {
    if (!error.message.startsWith('not within')) throw error;
    const state = exit === undefined ? 'still runs' : 'has just exited';
    throw new Error(
      `${error.message} (the launcher ${state}${lastLine(run)}); its output so far:\n${run.output()}`,
    );
  });
}

/** Resolves with the state file once the stack is ready; rejects if the launcher exits first. */
async function ready(run: Run, stateFile: string): Promise<StackState> {
  await whileRunning(run, () => existsSync(stateFile), START_MS, 'the stack becomes ready');
  return JSON.parse(readFileSync(stateFile, 'utf8')) as StackState;
}

interface Decision {
  allowed: boolean;
  results: { limit: number; remaining: number; mode: string }[];
}

async function decide(agent: string, subject: string, dryRun = false): Promise<Decision> {
  const r = await fetch(`${agent}/v1/decisions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ policy: 'demo', subject, dryRun }),
  });
  expect(r.status).toBe(200);
  return (await r.json()) as Decision;
}

describe('npm start (scripts/stack.ts)', { timeout: 240_000 }, () => {
  it('runs three regions, seeds the demo policy, serves decisions and budget changes, and stops clean on SIGTERM', async () => {
    const dir = scratch();
    const env = await stackEnv(dir);
    const run = launch(env);
    const state = await ready(run, env['QP_STACK_STATE_FILE']!);

    expect(state.servers).toBe('binaries');
    expect(state.coordinator).toBe(`http://127.0.0.1:${env['QP_STACK_COORDINATOR_PORT']}`);
    expect(state.agents).toEqual({
      us: `http://127.0.0.1:${env['QP_STACK_US_PORT']}`,
      eu: `http://127.0.0.1:${env['QP_STACK_EU_PORT']}`,
      ap: `http://127.0.0.1:${env['QP_STACK_AP_PORT']}`,
    });
    expect(state.grpc).toEqual({
      us: `grpc://127.0.0.1:${env['QP_STACK_US_GRPC_PORT']}`,
      eu: `grpc://127.0.0.1:${env['QP_STACK_EU_GRPC_PORT']}`,
      ap: `grpc://127.0.0.1:${env['QP_STACK_AP_GRPC_PORT']}`,
    });
    // The banner follows the state file (scripts/stack/launcher.ts writes it last of start()); a busy machine
    // may read the file before the banner is out.
    const line = `${state.agents['eu']}   ${state.grpc['eu']}   (Redis: cluster`;
    await eventually(() => run.output().includes(line), 10_000, 'the banner names the eu agent');
    expect(state.redis['us']).toBe(`redis://127.0.0.1:${env['QP_STACK_US_REDIS_PORT']}`);
    // NATS is locked down: TLS with the stack's own CA, and nobody without one of its nkeys gets in.
    expect(state.nats).toBe(`tls://127.0.0.1:${env['QP_STACK_NATS_PORT']}`);
    expect(state.secretsDir).toBe(env['QP_STACK_SECRETS_DIR']);
    const ca = readFileSync(join(state.secretsDir, 'tls', 'ca.pem'), 'utf8');
    await expect(
      connect({ servers: state.nats, tls: { ca }, maxReconnectAttempts: 0, timeout: 5000 }),
    ).rejects.toThrow(/Authorization Violation/);
    const agent = await connect({
      servers: state.nats,
      ...natsCredentials(
        join(state.secretsDir, 'nkeys', 'agent-us-1.nk'),
        join(state.secretsDir, 'tls', 'ca.pem'),
      ),
      maxReconnectAttempts: 0,
    });
    try {
      // Its own credential, with its region's permissions: another region's usage is refused by the server.
      const eu = protocolSubjects('qp').usage('eu');
      await expect(agent.request(eu, '{}', { timeout: 2000 })).rejects.toThrow(
        `Permissions Violation for Publish to "${eu}"`,
      );
    } finally {
      await agent.close();
    }
    expect(state.redis['eu']).toMatch(/^cluster 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+$/);
    expect(state.redis['ap']).toMatch(/^sentinel qp-ap 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+$/);
    expect(state.processes.map((p) => p.name)).toEqual([
      'nats',
      'redis us',
      'redis eu node 1',
      'redis eu node 2',
      'redis eu node 3',
      'redis ap master',
      'redis ap replica 1',
      'redis ap replica 2',
      'redis ap sentinel 1',
      'redis ap sentinel 2',
      'redis ap sentinel 3',
      'coordinator',
      'agent us',
      'agent eu',
      'agent ap',
    ]);

    // The banner prints the endpoints, the given admin token and a generated read token.
    const out = run.output();
    expect(out).toContain('quotaplane stack is ready');
    expect(out).toContain(`${ADMIN_TOKEN}   (from QP_ADMIN_TOKEN)`);
    const readToken = /read token\s+(\S+)\s+\(generated\)/.exec(out)?.[1];
    expect(readToken).toMatch(/^[0-9a-f]{48}$/);
    expect(out).toContain('"demo": capacity 90, refill 1.5/s, shared by 3 regions');
    // …and writes them, with the coordinator, to a file for another shell, readable by its owner alone.
    const envFile = env['QP_STACK_ENV_FILE']!;
    expect(out).toContain(`source ${envFile}`);
    expect(statSync(envFile).mode & 0o777).toBe(0o600);
    const sourced = execFileSync(
      'bash',
      [
        '-c',
        `source "$1" && printf '%s\\n' "$QP_ADMIN_TOKEN" "$QP_READ_TOKEN" "$QUOTAPLANE_URL" "$QUOTAPLANE_AGENTS"`,
        '-',
        envFile,
      ],
      { encoding: 'utf8', env: { PATH: process.env['PATH'] ?? '' } },
    );
    // The agents too, as `quotaplane explain` reads them.
    const agents = Object.entries(state.agents)
      .map(([region, url]) => `${region}=${url}`)
      .join(',');
    expect(sourced.split('\n')).toEqual([ADMIN_TOKEN, readToken, state.coordinator, agents, '']);

    // Before any traffic the budget is split evenly: each region enforces a third of 90. Dry runs report no
    // demand, so the shares stay where they are while the test looks.
    const probe = (agent: string) => decide(agent, `stack-probe-${state.stackId}`, true);
    for (const agent of Object.values(state.agents)) {
      expect((await probe(agent)).results[0]).toMatchObject({ limit: 30, remaining: 29, mode: 'regional' });
    }
    const allocations = await fetch(`${state.coordinator}/v1/allocations`, {
      headers: { authorization: `Bearer ${readToken}` },
    });
    expect(allocations.status).toBe(200);
    const shares = (
      (await allocations.json()) as { policies: { policy: string; shares: Record<string, number> }[] }
    ).policies.find((p) => p.policy === 'demo')!.shares;
    expect(Object.keys(shares).sort()).toEqual(['ap', 'eu', 'us']);
    for (const share of Object.values(shares)) expect(share).toBe(0.3333); // a third, rounded to the 4 decimals admin answers carry

    // A budget change through the admin API reaches every region: twice the capacity, twice each limit.
    const patch = await fetch(`${state.coordinator}/v1/policies/demo/budget`, {
      method: 'PATCH',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ capacity: 180 }),
    });
    expect(patch.status).toBe(200);
    expect(((await patch.json()) as { capacity: number }).capacity).toBe(180);
    for (const agent of Object.values(state.agents)) {
      await eventually(
        async () => (await probe(agent)).results[0]!.limit === 60,
        30_000,
        `${agent} enforces the new budget`,
      );
    }

    // A decision through each region's agent, charged to that region's own Redis (eu's is the cluster). Shares
    // may start to follow this demand, so only what holds whatever they do is asserted.
    const subject = (region: string) => `stack-${region}-${state.stackId}`;
    let sum = 0;
    for (const [region, agent] of Object.entries(state.agents)) {
      const d = await decide(agent, subject(region));
      const r = d.results[0]!;
      expect(d.allowed).toBe(true);
      expect(r.mode).toBe('regional');
      expect(r.limit).toBeGreaterThan(0);
      expect(r.remaining).toBeCloseTo(r.limit - 1, 6);
      sum += r.limit;
    }
    expect(sum).toBeLessThanOrEqual(180 + 1e-6);
    // ap's Redis is under Sentinel: its master dies, the stack stays up, and ap's agent decides again on the
    // promoted replica without a restart.
    const apMaster = state.processes.find((p) => p.name === 'redis ap master')!;
    process.kill(apMaster.pid!, 'SIGKILL');
    await eventually(
      async () => (await decide(state.agents['ap']!, subject('ap-after-failover'))).allowed,
      30_000,
      "ap's agent deciding on the promoted replica",
    );
    expect(run.output()).toContain(
      'redis ap master exited (signal SIGKILL); its sentinels promote a replica',
    );
    // Every agent serves Envoy's rate-limit service on the gRPC listener the banner names.
    for (const [region, url] of Object.entries(state.grpc)) {
      const client = rlsClient(url);
      try {
        const r = await client.shouldRateLimit({
          domain: 'stack',
          descriptors: [
            {
              entries: [
                { key: 'policy', value: 'demo' },
                { key: 'subject', value: subject(`grpc-${region}`) },
              ],
            },
          ],
        });
        expect(r.overall_code).toBe('OK');
        expect(r.statuses[0]!.current_limit?.name).toBe('demo');
      } finally {
        client.close();
      }
    }
    const us = new Redis(state.redis['us']!);
    const eu = new Cluster(
      state.redis['eu']!.slice('cluster '.length)
        .split(',')
        .map((n) => ({ host: '127.0.0.1', port: Number(n.split(':')[1]) })),
    );
    try {
      // Subjects reach Redis HMAC-hashed with the secret the stack generated and keeps in its secrets directory.
      const secret = readFileSync(join(state.secretsDir, 'subject-hmac.key'), 'utf8').trim();
      const hashed = (raw: string) => {
        const n = normalizeSubject(raw, { hmacSecret: secret });
        if (!n.ok) throw new Error(n.reason);
        return n.subject;
      };
      expect(await us.exists(`rl:v1:{${hashed(subject('us'))}}:demo`)).toBe(1);
      expect(await us.exists(`rl:v1:{${subject('us')}}:demo`)).toBe(0);
      expect(await us.exists(`rl:v1:{${hashed(subject('eu'))}}:demo`)).toBe(0);
      expect(await eu.exists(`rl:v1:{${hashed(subject('eu'))}}:demo`)).toBe(1);
      expect(await eu.exists(`rl:v1:{${hashed(subject('us'))}}:demo`)).toBe(0);
    } finally {
      us.disconnect();
      eu.disconnect();
    }

    // A listener that started after this instant is another test's, on a port the stack freed.
    const stoppedAt = uptimeSeconds();
    run.signal('SIGTERM');
    const exit = await within(run.exited, 90_000, 'the launcher exits after SIGTERM');
    expect(exit.code).toBe(0);
    expect(run.output()).toContain('SIGTERM: stopping the stack');
    expect(run.output()).toContain('stack stopped');
    expect(leftovers(state)).toEqual([]);
    expect(await takenOf(portsOf(state), stoppedAt, state)).toEqual([]);
    expect(existsSync(state.dataDir)).toBe(false);
    expect(existsSync(env['QP_STACK_STATE_FILE']!)).toBe(false);
    expect(existsSync(env['QP_STACK_ENV_FILE']!)).toBe(false);
  });

  it('stops everything and exits 1 when one of its processes dies, keeping the logs', async () => {
    const dir = scratch();
    const env = await stackEnv(dir);
    const run = launch(env);
    const state = await ready(run, env['QP_STACK_STATE_FILE']!);
    dirs.push(state.dataDir);
    const ap = state.processes.find((p) => p.name === 'agent ap')!;
    // A listener that started after this instant is another test's, on a port the stack freed (CI on
    // 2026-12-06 saw one such port taken after the stack had stopped).
    const stoppedAt = uptimeSeconds();
    process.kill(ap.pid!, 'SIGKILL');

    const exit = await within(run.exited, 90_000, 'the launcher exits after a process died');
    expect(exit.code).toBe(1);
    expect(run.output()).toContain('agent ap exited unexpectedly (signal SIGKILL)');
    expect(run.output()).toContain(`logs kept in ${state.dataDir}/logs`);
    expect(existsSync(join(state.dataDir, 'logs', 'agent-ap.log'))).toBe(true);
    expect(leftovers(state)).toEqual([]);
    expect(await takenOf(portsOf(state), stoppedAt, state)).toEqual([]);
  });

  it('stops what it started when SIGTERM comes during the start', async () => {
    const dir = scratch();
    const env = await fixedPortsEnv(dir);
    const run = launch(env);
    // Up to the coordinator's start the launcher does what ready() gives START_MS for: NATS and every Redis.
    await whileRunning(
      run,
      () => run.output().includes('starting the coordinator'),
      START_MS,
      'the coordinator starts',
    );
    const stackId = /^stack ([0-9a-f]+): logs in (\S+)\/logs$/m.exec(run.output());
    expect(stackId).not.toBeNull();
    // NATS and the coordinator carry the id (the line is printed just before the coordinator is spawned).
    await eventually(
      () => carryingId(stackId![1]!).length >= 2,
      10_000,
      'the stack id is found in processes',
    );
    const stoppedAt = uptimeSeconds();
    run.signal('SIGTERM');
    const exit = await within(run.exited, 60_000, 'the launcher exits');
    expect(exit.code).toBe(0);
    expect(run.output()).not.toContain('quotaplane stack is ready');
    const fixed = Object.entries(env)
      .filter(([k]) => k.endsWith('_PORT'))
      .map(([, v]) => Number(v));
    expect(fixed).toHaveLength(STACK_PORT_VARS.length);
    expect(await takenOf(fixed, stoppedAt, { stackId: stackId![1]!, dataDir: stackId![2]! })).toEqual([]);
    expect(carryingId(stackId![1]!)).toEqual([]);
    expect(existsSync(stackId![2]!)).toBe(false);
  });

  it('stops what it started when the process that started it exits, its output pipe closing', async () => {
    const dir = scratch();
    const env = await fixedPortsEnv(dir);
    // A parent that reads the launcher's output through a pipe (as npm, a test helper or `| tee` do) and exits
    // once the stack is ready, without a signal to the launcher.
    const parent = spawn(
      process.execPath,
      [
        '-e',
        `const { spawn } = require('node:child_process');
         const { existsSync } = require('node:fs');
         const launcher = spawn(process.execPath, ['--import', 'tsx', 'scripts/stack.ts'], { stdio: ['ignore', 'pipe', 'pipe'] });
         launcher.stdout.resume();
         launcher.stderr.resume();
         const poll = setInterval(() => {
           if (existsSync(process.env.QP_STACK_STATE_FILE)) { clearInterval(poll); process.exit(0); }
         }, 100);`,
      ],
      {
        cwd: ROOT,
        env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? '/root', ...env },
        stdio: 'ignore',
      },
    );
    const parentExit = await within(
      new Promise<number | null>((resolve) => parent.once('exit', resolve)),
      150_000,
      'the parent exits once the stack is ready',
    );
    expect(parentExit).toBe(0);
    // The stack stops from here on: a listener that started later is another test's.
    const stoppedAt = uptimeSeconds();
    const state = JSON.parse(readFileSync(join(dir, 'state.json'), 'utf8')) as StackState;
    expect(leftovers(state, { launcher: true }).length).toBeGreaterThanOrEqual(5);
    // The launcher sees its parent gone within 500 ms and stops the stack in order: agents, coordinator, servers.
    await eventually(
      () => leftovers(state, { launcher: true }).length === 0,
      60_000,
      'every process of the stack, and the launcher, gone',
    ).catch((error: Error) => {
      throw new Error(`${error.message}: ${leftovers(state, { launcher: true }).join(', ')}`);
    });
    expect(await takenOf(portsOf(state), stoppedAt, state)).toEqual([]);
  });

  it('names a taken port and the variable that moves it, and starts nothing', async () => {
    const dir = scratch();
    const env = await stackEnv(dir);
    const blocker: Server = createServer();
    const port = Number(env['QP_STACK_US_PORT']);
    await new Promise<void>((resolve) => blocker.listen(port, '127.0.0.1', resolve));
    try {
      const run = launch(env);
      const exit = await within(run.exited, 60_000, 'the launcher exits');
      expect(exit.code).toBe(2);
      expect(run.output()).toContain(
        `port ${port} (agent us) is already in use; set QP_STACK_US_PORT to another port`,
      );
      expect(run.output()).not.toContain('starting');
      const others = ['QP_STACK_NATS_PORT', 'QP_STACK_COORDINATOR_PORT', 'QP_STACK_AP_REDIS_PORT'].map((k) =>
        Number(env[k]),
      );
      expect(await takenOf(others)).toEqual([]);
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
  });

  it('says what to install when neither the servers nor Docker are there', async () => {
    const dir = scratch();
    const env = await stackEnv(dir);
    const run = launch({ ...env, QP_STACK_SERVERS: 'auto', PATH: dir });
    const exit = await within(run.exited, 60_000, 'the launcher exits');
    expect(exit.code).toBe(2);
    const out = run.output();
    expect(out).toContain('redis-server is not on PATH');
    expect(out).toContain('nats-server is not on PATH');
    expect(out).toContain('docker is not on PATH');
    expect(out).toContain('apt-get install -y redis-server nats-server');
    expect(out).not.toContain('starting');
  });

  it('lists every problem of a bad environment and exits 2', async () => {
    const run = launch({ QP_STACK_US_PORT: 'x', QP_ADMIN_TOKEN: 'short', QP_AGENT_REGION: 'eu' });
    const exit = await within(run.exited, 60_000, 'the launcher exits');
    expect(exit.code).toBe(2);
    const out = run.output();
    expect(out).toContain('invalid stack configuration');
    expect(out).toContain('QP_STACK_US_PORT: ports are integers 0-65535');
    expect(out).toContain('QP_ADMIN_TOKEN: tokens must be at least 16 characters');
    expect(out).toContain('QP_AGENT_REGION: the launcher sets QP_REGION itself');
    expect(out).not.toContain('short');
  });
});
