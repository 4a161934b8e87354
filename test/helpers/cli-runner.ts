/**
 * Runs the `quotaplane` command in process (cli/run.ts) with captured output, against whatever coordinator the
 * test points it at.
 */
import { fileURLToPath } from 'node:url';
import { run } from '../../cli/run.js';

export interface CliResult {
  readonly status: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface CliOptions {
  readonly env?: Record<string, string | undefined>;
  readonly fetch?: typeof fetch;
  readonly stdin?: string;
  readonly now?: () => number;
}

export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

export async function cli(argv: readonly string[], options: CliOptions = {}): Promise<CliResult> {
  let stdout = '';
  let stderr = '';
  const status = await run(argv, {
    env: options.env ?? {},
    stdout: (t) => (stdout += t),
    stderr: (t) => (stderr += t),
    ...(options.stdin !== undefined ? { stdin: () => Promise.resolve(options.stdin!) } : {}),
    ...(options.fetch !== undefined ? { fetch: options.fetch } : {}),
    ...(options.now !== undefined ? { now: options.now } : {}),
    root: REPO_ROOT,
  });
  return { status, stdout, stderr };
}
