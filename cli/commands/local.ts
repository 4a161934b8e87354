/**
 * `quotaplane simulate …` and `quotaplane stack …`: the repository's simulator and local stack, run as child
 * processes with the terminal passed through, so their progress, tables, signals and exit codes are theirs.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { UsageError, type Context } from '../context.js';
import { setOwn } from '../../core/own-keys.js';
import { STACK_PORT_VARS } from '../../scripts/stack/config.js';

export const STACK_USAGE = `usage:
  quotaplane stack [--geo] [--any-ports] [--state-file FILE]
    the local three-region stack, as npm start runs it but from source (no build); Ctrl-C stops it
    --geo              regions a WAN apart (QP_STACK_TOPOLOGY=geo, as npm start -- --geo)
    --any-ports        every port picked free (QP_STACK_*_PORT=0) instead of 7100-7131
    --state-file FILE  write the endpoints there once ready (QP_STACK_STATE_FILE)
  every QP_STACK_* variable of docs/running.md applies`;

export const SIMULATE_USAGE = `usage:
  quotaplane simulate [simulator flags]     (quotaplane simulate --help lists them)`;

/** Run `node --import tsx SCRIPT args` from the repository root; resolves with its exit status. */
function runScript(
  ctx: Context,
  script: string,
  args: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', join(ctx.io.root, script), ...args], {
      cwd: process.cwd(),
      env,
      stdio: 'inherit',
    });
    // The child shares the terminal: Ctrl-C reaches it directly. A signal sent to this process alone is passed on.
    const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
    const handlers = (['SIGINT', 'SIGTERM', 'SIGHUP'] as const).map((s) => [s, forward(s)] as const);
    for (const [s, h] of handlers) process.on(s, h);
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      for (const [s, h] of handlers) process.off(s, h);
      resolve(code ?? (signal === 'SIGINT' ? 130 : 1));
    });
  });
}

export async function simulateCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  return runScript(ctx, 'simulations/cli.ts', argv, { ...process.env, ...ctx.io.env });
}

export async function stackCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const env: NodeJS.ProcessEnv = { ...process.env, ...ctx.io.env };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--help' || arg === '-h') return (ctx.say(STACK_USAGE), 0);
    if (arg === '--any-ports') for (const name of STACK_PORT_VARS) setOwn(env, name, '0');
    else if (arg === '--geo') env['QP_STACK_TOPOLOGY'] = 'geo';
    else if (arg === '--state-file' || arg.startsWith('--state-file=')) {
      const value = arg.includes('=') ? arg.slice(arg.indexOf('=') + 1) : argv[++i];
      if (value === undefined || value === '') throw new UsageError('--state-file needs a path', STACK_USAGE);
      env['QP_STACK_STATE_FILE'] = value;
    } else throw new UsageError(`unknown stack flag "${arg}"`, STACK_USAGE);
  }
  return runScript(ctx, 'scripts/stack.ts', [], env);
}
