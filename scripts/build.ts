/**
 * `npm run build` (and `npm start` before it starts the stack): the coordinator and the regional agent as
 * JavaScript in dist/, compiled as the images compile them (docker/tsconfig.build.json, with type checking), and
 * the files they read beside their compiled code: lua/, proto/ and the dashboard's page. When no input changed
 * since the last build it does nothing; otherwise tsc builds incrementally. Exits with tsc's status.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync, rmSync, statSync, utimesSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = join(root, 'dist');
const started = Date.now();
const INPUTS = [
  'core',
  'common',
  'coordinator',
  'regional-agent',
  'lua',
  'proto',
  'tsconfig.json',
  'docker/tsconfig.build.json',
];

/** The newest modification time under `path` (a file or a directory), ms. */
function newest(path: string): number {
  const stat = statSync(path, { throwIfNoEntry: false });
  if (stat === undefined) return 0;
  if (!stat.isDirectory()) return stat.mtimeMs;
  let latest = stat.mtimeMs;
  for (const entry of readdirSync(path)) latest = Math.max(latest, newest(join(path, entry)));
  return latest;
}

// Nothing changed since the last build (no input newer than its build info): nothing to do, not even the type
// check tsc's incremental mode would still run (seconds on a busy machine). `--force` builds anyway.
const built = statSync(join(dist, '.tsbuildinfo'), { throwIfNoEntry: false })?.mtimeMs;
if (
  !process.argv.includes('--force') &&
  built !== undefined &&
  INPUTS.every((input) => newest(join(root, input)) < built)
) {
  process.stderr.write('dist/ is up to date\n');
  process.exit(0);
}
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const run = spawnSync(
  process.execPath,
  [
    tsc,
    '-p',
    join(root, 'docker/tsconfig.build.json'),
    '--incremental',
    '--tsBuildInfoFile',
    join(dist, '.tsbuildinfo'),
  ],
  { stdio: 'inherit' },
);
if (run.status !== 0) {
  process.stderr.write(`build failed: tsc exited with ${run.status ?? run.signal}\n`);
  process.exit(run.status ?? 1);
}
// Read at run time relative to the compiled code (regional-agent/redis/scripts.ts, regional-agent/grpc/rls-server.ts,
// coordinator/http/dashboard-routes.ts), as the Dockerfile copies them.
for (const dir of ['lua', 'proto', 'coordinator/dashboard']) {
  rmSync(join(dist, dir), { recursive: true, force: true });
  cpSync(join(root, dir), join(dist, dir), { recursive: true });
}
// tsc leaves its build info alone when nothing it emits changed (a Lua or dashboard edit): mark this build.
const now = new Date();
utimesSync(join(dist, '.tsbuildinfo'), now, now);
process.stderr.write(`built dist/ in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
