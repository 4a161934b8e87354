/**
 * The Debian packages the integration tier runs: redis-server and redis-tools (Redis and Redis Cluster),
 * nats-server, chromium (the dashboard's browser test) and nginx (the forward-auth tests). The global setup checks
 * them before anything starts and installs the missing ones the way `.ci/run` does (`apt-get update`, then
 * `apt-get install -y`, as root, bounded in time), saying so on stderr. When it cannot (not root, no network,
 * `QP_TEST_INSTALL=0`), it says why, and each test that needs a missing package fails with that reason and the
 * line that installs it; a test never skips for a missing package.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';

const exec = promisify(execFile);

/** One package the tests need, and where its binary is found. */
export interface SystemPackage {
  /** The Debian package. */
  name: string;
  /** The binary the tests run. */
  binary: string;
  /** Absolute paths tried besides PATH. */
  paths: readonly string[];
  /** What needs it, for the messages. */
  usedBy: string;
}

export const SYSTEM_PACKAGES: readonly SystemPackage[] = [
  { name: 'redis-server', binary: 'redis-server', paths: [], usedBy: 'every integration test' },
  {
    name: 'redis-tools',
    binary: 'redis-cli',
    paths: [],
    usedBy: 'the Redis Cluster of the integration tier',
  },
  {
    name: 'nats-server',
    binary: 'nats-server',
    paths: ['/usr/sbin/nats-server'],
    usedBy: 'every integration test',
  },
  {
    name: 'chromium',
    binary: 'chromium',
    paths: ['/usr/bin/chromium'],
    usedBy: 'test/integration/coordinator/http/dashboard-browser.test.ts',
  },
  {
    name: 'nginx',
    binary: 'nginx',
    paths: ['/usr/sbin/nginx', '/usr/bin/nginx', '/usr/local/sbin/nginx'],
    usedBy: 'test/integration/regional-agent/http/forward-auth-nginx.test.ts',
  },
];

/** The one line that installs every package the tests need (README, CONTRIBUTING, docs/running.md). */
export const INSTALL_LINE = `sudo apt-get update && sudo apt-get install -y ${SYSTEM_PACKAGES.map((p) => p.name).join(' ')}`;

/** Time apt-get may take: `update` and `install` each (chromium and its libraries are about 100 MB). */
export const APT_TIMEOUT_MS = { update: 120_000, install: 600_000 } as const;

/** Where a package's binary is, or undefined when it is not installed. */
export function findBinary(pkg: SystemPackage, path = process.env['PATH'] ?? ''): string | undefined {
  const dirs = path.split(delimiter).filter((d) => d !== '');
  for (const candidate of [...pkg.paths, ...dirs.map((d) => join(d, pkg.binary))]) {
    if (existsSync(candidate)) return candidate;
  }
  return undefined;
}

/** A package still missing after the setup, and why it was not installed. */
export interface MissingPackage {
  name: string;
  reason: string;
}

export interface EnsureOptions {
  /** Packages to check (all by default). */
  packages?: readonly SystemPackage[];
  /** Whether installing may be tried (QP_TEST_INSTALL=0 turns it off). */
  install?: boolean;
  /** Root may install (process.getuid() === 0). */
  root?: boolean;
  /** Runs apt-get; the default runs the real one with DEBIAN_FRONTEND=noninteractive. */
  apt?: (args: readonly string[], timeoutMs: number) => Promise<void>;
  /** Where messages go (stderr). */
  say?: (line: string) => void;
  /** Where a package's binary is (findBinary). */
  find?: (pkg: SystemPackage) => string | undefined;
}

async function runApt(args: readonly string[], timeoutMs: number): Promise<void> {
  await exec('apt-get', [...args], {
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
    maxBuffer: 16 * 1024 * 1024,
  });
}

/** The first line of an error, without apt's progress noise. */
function firstLine(error: unknown): string {
  const e = error as { killed?: boolean; stderr?: string; message?: string };
  if (e.killed === true) return 'timed out';
  const text = (e.stderr ?? '').trim() || (e.message ?? String(error));
  const line = text.split('\n').find((l) => /^(E|W|Err):/.test(l)) ?? text.split('\n')[0]!;
  return line.trim();
}

/**
 * Check the packages and install the missing ones when this process may (root, installing not turned off).
 * Answers what is still missing, each with the reason it is; every step is said on stderr.
 */
export async function ensureSystemPackages(options: EnsureOptions = {}): Promise<MissingPackage[]> {
  const packages = options.packages ?? SYSTEM_PACKAGES;
  const find = options.find ?? ((p: SystemPackage) => findBinary(p));
  const say = options.say ?? ((line: string) => process.stderr.write(`[quotaplane tests] ${line}\n`));
  const missing = packages.filter((p) => find(p) === undefined);
  if (missing.length === 0) return [];
  const names = missing.map((p) => p.name).join(' ');
  const install = options.install ?? process.env['QP_TEST_INSTALL'] !== '0';
  const root = options.root ?? process.getuid?.() === 0;
  const notInstalled = (why: string, left = missing): MissingPackage[] => {
    for (const p of left) say(`${p.name} is missing (${p.usedBy} needs it): ${why}`);
    say(`install what the tests need with: ${INSTALL_LINE}`);
    return left.map((p) => ({
      name: p.name,
      reason: `${p.name} is not installed and the test setup did not install it (${why}); install it with: sudo apt-get install -y ${p.name}`,
    }));
  };
  if (!install) return notInstalled('QP_TEST_INSTALL=0');
  if (!root) return notInstalled('not root, so it cannot run apt-get');
  const apt = options.apt ?? runApt;
  say(
    `missing: ${names}; installing as .ci/run does: apt-get update && apt-get install -y ${names} ` +
      `(at most ${(APT_TIMEOUT_MS.update + APT_TIMEOUT_MS.install) / 60_000} min)`,
  );
  const started = Date.now();
  try {
    await apt(['update', '-qq'], APT_TIMEOUT_MS.update);
  } catch (error) {
    return notInstalled(`apt-get update failed: ${firstLine(error)}`);
  }
  try {
    await apt(['install', '-y', '-qq', ...missing.map((p) => p.name)], APT_TIMEOUT_MS.install);
  } catch (error) {
    return notInstalled(`apt-get install failed: ${firstLine(error)}`);
  }
  const still = missing.filter((p) => find(p) === undefined);
  if (still.length > 0) {
    return notInstalled(`apt-get install left no ${still.map((p) => p.binary).join(', ')}`, still);
  }
  say(`installed ${names} in ${Math.round((Date.now() - started) / 1000)} s`);
  return [];
}

/** The reason `name` is missing after the setup, or undefined when it is installed. */
export function missingReason(missing: readonly MissingPackage[], name: string): string | undefined {
  return missing.find((m) => m.name === name)?.reason;
}
