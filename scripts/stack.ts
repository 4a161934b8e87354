/**
 * `npm start`: the three-region stack on loopback, from the environment (docs/running.md). The only place that
 * reads the environment, handles signals and decides the exit code:
 *   0 stopped on a signal, 1 a process failed (at start or later), 2 bad configuration, a port taken, or no way
 *   to run Redis and NATS.
 * Ctrl-C, SIGTERM, SIGHUP, or the death of the process that started it stop every process it started, in
 * order; a second Ctrl-C (more than two seconds after the first) kills them at once.
 */
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { banner } from './stack/banner.js';
import { loadStackConfig, StackConfigError } from './stack/config.js';
import { Stack, StackStopped } from './stack/launcher.js';
import { describeTaken, resolvePorts, takenPorts } from './stack/ports.js';
import { compiledEntry } from './stack/services.js';
import {
  binaryServers,
  chooseServers,
  dockerServers,
  NoServersError,
  systemToolbox,
} from './stack/servers.js';

/** Signals closer together than this are one request (npm forwards the terminal's Ctrl-C a second time). */
const REPEAT_MS = 2000;

const say = (line: string) => process.stdout.write(`${line}\n`);
// The output may be a pipe whose reader went away (the parent that started the launcher exited, the usual case
// for 'parent exited' below): a write to it fails with EPIPE, which unhandled would crash the launcher halfway
// through stopping the stack and orphan the rest. Such output is dropped.
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
const fail = (text: string, code: number): never => {
  process.stderr.write(`${text}\n`);
  process.exit(code);
};

async function main(): Promise<void> {
  const root = fileURLToPath(new URL('..', import.meta.url));
  // `npm start -- --geo`: the geo topology, as QP_STACK_TOPOLOGY=geo would. `--compiled` (npm start passes it,
  // after `npm run build`): the services run from dist/, as QP_STACK_RUNTIME=compiled would.
  const args = process.argv.slice(2);
  const unknown = args.filter((a) => a !== '--geo' && a !== '--compiled');
  if (unknown.length > 0) fail(`unknown argument ${unknown.join(' ')} (known: --geo, --compiled)`, 2);
  let config;
  try {
    config = loadStackConfig({
      ...process.env,
      ...(args.includes('--geo') ? { QP_STACK_TOPOLOGY: 'geo' } : {}),
      ...(args.includes('--compiled') ? { QP_STACK_RUNTIME: 'compiled' } : {}),
    });
  } catch (error) {
    if (error instanceof StackConfigError) fail(error.message, 2);
    throw error;
  }
  if (config.runtime === 'compiled') {
    const missing = (['coordinator/main.ts', 'regional-agent/main.ts'] as const)
      .map(compiledEntry)
      .filter((entry) => !existsSync(join(root, entry)));
    if (missing.length > 0)
      fail(`${missing.join(' and ')} missing: run npm run build first (npm start does)`, 2);
  }
  // Every problem that stops the start is told at once (a taken port and no way to run the servers), before
  // anything starts: choosing the servers only looks at PATH and Docker.
  const taken = await takenPorts(config);
  const resolved = await resolvePorts(config);
  const stackId = randomBytes(4).toString('hex');
  let runner;
  const problems = taken.length > 0 ? [describeTaken(taken)] : [];
  try {
    runner = await chooseServers(resolved.servers, systemToolbox(process.env), {
      binaries: () => binaryServers(root),
      docker: () => dockerServers(root, stackId, resolved.images),
    });
  } catch (error) {
    if (!(error instanceof NoServersError)) throw error;
    problems.push(error.message);
  }
  if (problems.length > 0 || runner === undefined) return fail(problems.join('\n\n'), 2);
  const stack = new Stack(resolved, { runner, cwd: root, env: process.env, say, stackId });

  let exiting = false;
  const shutdown = (code: number, keepData = false) => {
    if (exiting) return;
    exiting = true;
    stack.stop({ keepData }).then(
      () => {
        say(code === 0 ? 'stack stopped' : 'stack stopped after a failure');
        if (keepData) say(`logs kept in ${stack.dataDir}/logs`);
        process.exit(code);
      },
      (error: unknown) => fail(`stopping the stack failed: ${String(error)}`, 1),
    );
  };

  let firstSignalAt = 0;
  const onSignal = (signal: string) => {
    const now = Date.now();
    if (firstSignalAt === 0) {
      firstSignalAt = now;
      say(`${signal}: stopping the stack (agents, coordinator, then servers)`);
      shutdown(0);
    } else if (now - firstSignalAt > REPEAT_MS) {
      say(`${signal} again: killing every process of the stack`);
      stack.kill();
    }
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGHUP', () => onSignal('SIGHUP'));
  // Whoever started the launcher (a shell, npm) went away without a signal reaching it: stop as on SIGTERM.
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) onSignal('parent exited');
  }, 500).unref();

  void stack.failure.then((f) => {
    const how = f.status.signal !== null ? `signal ${f.status.signal}` : `code ${f.status.code}`;
    process.stderr.write(
      `${f.name} exited unexpectedly (${how}); its last lines (${f.logFile}):\n${f.tail}\n`,
    );
    shutdown(1, true);
  });

  try {
    await stack.start();
  } catch (error) {
    if (error instanceof StackStopped) return;
    process.stderr.write(
      `the stack did not start: ${error instanceof Error ? error.message : String(error)}\n`,
    );
    shutdown(1, true);
    return;
  }
  say(banner(stack, { admin: config.adminToken !== undefined, read: config.readToken !== undefined }));
}

main().catch((error: unknown) => {
  process.stderr.write(
    `stack launcher failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
  );
  process.exit(1);
});
