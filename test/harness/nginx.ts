/**
 * A real nginx for forward-auth tests: Debian's `nginx` run unprivileged from a configuration of its own (pid,
 * logs and every `*_temp_path` in a temporary directory, one process, listening on a free loopback port). When
 * the binary is missing the global setup installs it (`apt-get update`, then `apt-get install -y nginx`, as
 * `.ci/run` does: a fresh machine's package lists are empty or stale) if it can, and otherwise the test fails
 * loudly with the reason: a forward-auth test never skips.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inject } from 'vitest';
import { freePort, waitForPort } from './ports.js';
import { ensureSystemPackages, findBinary, missingReason, SYSTEM_PACKAGES } from './system-packages.js';

export interface NginxServer extends AsyncDisposable {
  readonly port: number;
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
  /** The temporary directory holding the configuration, logs and temp paths. */
  readonly dir: string;
  /** The error log so far (auth_request problems show there). */
  errorLog(): string;
}

/** What a test's `http { }` block is built from. */
export interface NginxContext {
  /** The port nginx must listen on (127.0.0.1). */
  port: number;
  /** A directory for files the configuration names (password files…). */
  dir: string;
}

/**
 * The nginx binary. The global setup installs it when it is missing and it can (system-packages.ts); when it could
 * not, this fails with its reason. Outside that setup, it tries once itself.
 */
export async function nginxBinary(): Promise<string> {
  const pkg = SYSTEM_PACKAGES.find((p) => p.name === 'nginx')!;
  const found = findBinary(pkg);
  if (found !== undefined) return found;
  const why = missingReason(inject('missingPackages') ?? [], 'nginx');
  if (why !== undefined) throw new Error(why);
  const [left] = await ensureSystemPackages({ packages: [pkg] });
  if (left !== undefined) throw new Error(left.reason);
  return findBinary(pkg)!;
}

/**
 * Start nginx with `httpBlock(context)` inside its `http { }`. One process (`master_process off`), so it needs
 * no user switch and reads files the test wrote; stopped and its directory removed on dispose.
 */
export async function startNginx(httpBlock: (context: NginxContext) => string): Promise<NginxServer> {
  const bin = await nginxBinary();
  const dir = mkdtempSync(join(tmpdir(), 'qp-nginx-'));
  const port = await freePort();
  for (const sub of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, sub));
  const errorLog = join(dir, 'error.log');
  const conf = [
    'daemon off;',
    'master_process off;',
    `pid ${join(dir, 'nginx.pid')};`,
    `error_log ${errorLog} info;`,
    'events { worker_connections 256; }',
    'http {',
    '  access_log off;',
    ...['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map(
      (t) => `  ${t === 'body' ? 'client_body' : t}_temp_path ${join(dir, t)};`,
    ),
    httpBlock({ port, dir }),
    '}',
    '',
  ].join('\n');
  const confPath = join(dir, 'nginx.conf');
  writeFileSync(confPath, conf);
  const readLog = () => (existsSync(errorLog) ? readFileSync(errorLog, 'utf8') : '');

  let output = '';
  const child: ChildProcess = spawn(bin, ['-p', dir, '-c', confPath], { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout?.on('data', (d: Buffer) => (output = (output + d.toString()).slice(-4000)));
  child.stderr?.on('data', (d: Buffer) => (output = (output + d.toString()).slice(-4000)));
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const early = exited.then(() => {
    throw new Error(`nginx exited at start:\n${output}\n${readLog()}\nconfiguration:\n${conf}`);
  });
  early.catch(() => undefined);
  await Promise.race([waitForPort('127.0.0.1', port, 10_000), early]);

  return {
    port,
    url: `http://127.0.0.1:${port}`,
    dir,
    errorLog: readLog,
    async [Symbol.asyncDispose]() {
      process.removeListener('exit', killOnExit);
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGQUIT');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
