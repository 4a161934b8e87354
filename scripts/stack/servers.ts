/**
 * Where the stack's Redis and NATS servers come from: `redis-server` and `nats-server` from PATH, or the same
 * servers in containers (host networking, so ports and addresses are the same either way). Both are plain
 * ManagedProcesses: a container runs attached (`docker run --rm`), so the CLI passes SIGTERM on and its exit
 * is the server's exit.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import type { ServerSource } from './config.js';
import { ManagedProcess } from './managed-process.js';

const exec = promisify(execFile);

/** One server to run. */
export interface ServerSpec {
  readonly name: string;
  readonly host: string;
  readonly port: number;
  /** A directory of its own (data, cluster config). */
  readonly dir: string;
  readonly logFile: string;
  readonly env: NodeJS.ProcessEnv;
}

/**
 * The NATS server's configuration (coordinator/nats/secrets-bundle.ts writes it): the file, and the secrets
 * directory its certificate paths point into.
 */
export interface NatsConfig {
  readonly configFile: string;
  readonly secretsDir: string;
}

/** Where a NATS server of a runner sees the secrets directory and keeps its JetStream data. */
export interface NatsView {
  readonly secretsDir: string;
  readonly storeDir: string;
}

/** Starts servers of one kind; `cleanup()` removes whatever a killed launcher could have left behind. */
export interface ServerRunner {
  readonly kind: 'binaries' | 'docker';
  /** One line for the banner: what runs the servers. */
  readonly description: string;
  redis(spec: ServerSpec, options: RedisRole): ManagedProcess;
  /** A sentinel on `spec.port` watching the master of `monitor`. */
  sentinel(spec: ServerSpec, monitor: SentinelMonitor): ManagedProcess;
  /** Paths as the NATS server of `spec` will see them, for its configuration file. */
  natsView(spec: ServerSpec, secretsDir: string): NatsView;
  /** NATS with the configuration file (listen address, JetStream, users, TLS all in it). */
  nats(spec: ServerSpec, config: NatsConfig): ManagedProcess;
  cleanup(): Promise<void>;
}

/** What a Redis of the stack is: a cluster node, a replica of the master on `replicaOf`, or a lone master. */
export interface RedisRole {
  readonly cluster: boolean;
  readonly replicaOf?: number | undefined;
}

/** What a sentinel watches, and how quickly it acts (docs/running.md, "Redis high availability"). */
export interface SentinelMonitor {
  readonly masterName: string;
  readonly masterPort: number;
}

/** A sentinel's configuration file (Sentinel rewrites it, so it is written where the sentinel may). */
function sentinelConfig(spec: ServerSpec, monitor: SentinelMonitor, dir: string): string {
  const name = monitor.masterName;
  return [
    `port ${spec.port}`,
    `bind ${spec.host}`,
    `dir ${dir}`,
    `sentinel monitor ${name} ${spec.host} ${monitor.masterPort} 2`,
    `sentinel down-after-milliseconds ${name} 1000`,
    `sentinel failover-timeout ${name} 3000`,
    `sentinel parallel-syncs ${name} 1`,
    '',
  ].join('\n');
}

function redisArgs(host: string, port: number, dir: string, role: RedisRole): string[] {
  const args = ['--port', String(port), '--bind', host, '--save', '', '--appendonly', 'no', '--dir', dir];
  args.push('--protected-mode', 'no');
  if (role.replicaOf !== undefined) args.push('--replicaof', host, String(role.replicaOf));
  const cluster = role.cluster;
  if (cluster) {
    args.push(
      '--cluster-enabled',
      'yes',
      '--cluster-config-file',
      'nodes.conf',
      '--cluster-node-timeout',
      '5000',
    );
  }
  return args;
}

/** Where a container sees the secrets directory and the configuration file (both mounted read-only). */
const CONTAINER_SECRETS = '/secrets';
const CONTAINER_NATS_CONFIG = '/etc/quotaplane-nats.conf';

/** Servers from PATH. */
export function binaryServers(cwd: string): ServerRunner {
  return {
    kind: 'binaries',
    description: 'redis-server and nats-server from PATH',
    redis: (spec, role) =>
      new ManagedProcess({
        name: spec.name,
        command: 'redis-server',
        args: redisArgs(spec.host, spec.port, spec.dir, role),
        env: spec.env,
        cwd,
        logFile: spec.logFile,
      }),
    sentinel: (spec, monitor) => {
      const file = join(spec.dir, 'sentinel.conf');
      writeFileSync(file, sentinelConfig(spec, monitor, spec.dir));
      return new ManagedProcess({
        name: spec.name,
        command: 'redis-server',
        args: [file, '--sentinel'],
        env: spec.env,
        cwd,
        logFile: spec.logFile,
      });
    },
    natsView: (spec, secretsDir) => ({ secretsDir, storeDir: join(spec.dir, 'jetstream') }),
    nats: (spec, config) =>
      new ManagedProcess({
        name: spec.name,
        command: 'nats-server',
        args: ['-c', config.configFile],
        env: spec.env,
        cwd,
        logFile: spec.logFile,
      }),
    cleanup: () => Promise.resolve(),
  };
}

/** Label on every container one launcher starts, so they can all be found and removed. */
export const STACK_LABEL = 'org.quotaplane.stack';

/** Servers in containers with host networking; `stackId` names and labels them. */
export function dockerServers(
  cwd: string,
  stackId: string,
  images: { redis: string; nats: string },
): ServerRunner {
  const run = (spec: ServerSpec, image: string, command: string[], mounts: string[] = []) =>
    new ManagedProcess({
      name: spec.name,
      command: 'docker',
      args: [
        'run',
        '--rm',
        '--name',
        `qp-stack-${stackId}-${spec.name.replace(/[^a-z0-9]+/g, '-')}`,
        '--label',
        `${STACK_LABEL}=${stackId}`,
        '--network',
        'host',
        ...mounts.flatMap((m) => ['--volume', m]),
        image,
        ...command,
      ],
      env: spec.env,
      cwd,
      logFile: spec.logFile,
    });
  return {
    kind: 'docker',
    description: `containers (${images.redis}, ${images.nats}; host networking)`,
    redis: (spec, role) =>
      run(spec, images.redis, ['redis-server', ...redisArgs(spec.host, spec.port, '/data', role)]),
    // The configuration is written inside the container, where the sentinel may rewrite it.
    sentinel: (spec, monitor) =>
      run(spec, images.redis, [
        'sh',
        '-c',
        `printf '%s' '${sentinelConfig(spec, monitor, '/data')}' > /data/sentinel.conf && exec redis-server /data/sentinel.conf --sentinel`,
      ]),
    // JetStream stays inside the container (removed with it), as the launcher's temporary data would be.
    natsView: () => ({ secretsDir: CONTAINER_SECRETS, storeDir: '/data/jetstream' }),
    nats: (spec, config) =>
      run(
        spec,
        images.nats,
        ['nats-server', '-c', CONTAINER_NATS_CONFIG],
        [`${config.secretsDir}:${CONTAINER_SECRETS}:ro`, `${config.configFile}:${CONTAINER_NATS_CONFIG}:ro`],
      ),
    async cleanup() {
      const { stdout } = await exec('docker', [
        'ps',
        '-aq',
        '--filter',
        `label=${STACK_LABEL}=${stackId}`,
      ]).catch(() => ({ stdout: '' }));
      const ids = stdout.split('\n').filter((s) => s.length > 0);
      if (ids.length > 0) await exec('docker', ['rm', '-f', ...ids]).catch(() => undefined);
    },
  };
}

/** What the machine offers, probed once. */
export interface Toolbox {
  /** Whether an executable of this name is on PATH. */
  hasCommand(name: string): boolean;
  /** undefined when a Docker daemon answers; else why not. */
  dockerProblem(): Promise<string | undefined>;
}

/** An executable named `name` in one of the PATH directories. */
export function onPath(name: string, path: string | undefined): boolean {
  for (const dir of (path ?? '').split(delimiter)) {
    if (dir.length === 0) continue;
    try {
      accessSync(join(dir, name), constants.X_OK);
      return true;
    } catch {
      // not here
    }
  }
  return false;
}

/** The real machine. */
export function systemToolbox(env: NodeJS.ProcessEnv): Toolbox {
  return {
    hasCommand: (name) => onPath(name, env['PATH']),
    async dockerProblem() {
      if (!onPath('docker', env['PATH'])) return 'docker is not on PATH';
      try {
        await exec('docker', ['info', '--format', '{{.ServerVersion}}'], { timeout: 10_000, env });
        return undefined;
      } catch (error) {
        const text = String((error as { stderr?: string }).stderr ?? (error as Error).message).trim();
        return `docker is installed but its daemon does not answer (${text.split('\n')[0]})`;
      }
    },
  };
}

/** Thrown when no way to run the servers exists; the message says what to install. */
export class NoServersError extends Error {
  readonly code = 'STACK_NO_SERVERS';
}

const INSTALL_HINT = [
  'Install either:',
  '  - the servers: Debian/Ubuntu `sudo apt-get install -y redis-server nats-server`,',
  '    macOS `brew install redis nats-server` (redis-server and nats-server must be on PATH);',
  '  - or Docker (https://docs.docker.com/engine/install/), with its daemon running: the stack then runs',
  '    the servers in containers (REDIS_IMAGE, default redis:7.2-alpine; NATS_IMAGE, default nats:2.10-alpine).',
].join('\n');

/** The way to run the servers that `source` asks for, or a NoServersError saying what is missing. */
export async function chooseServers(
  source: ServerSource,
  tools: Toolbox,
  make: { binaries: () => ServerRunner; docker: () => ServerRunner },
): Promise<ServerRunner> {
  const missing = ['redis-server', 'nats-server'].filter((c) => !tools.hasCommand(c));
  if (source === 'binaries' || (source === 'auto' && missing.length === 0)) {
    if (missing.length === 0) return make.binaries();
    throw new NoServersError(
      `cannot start the stack: QP_STACK_SERVERS=binaries but ${missing.join(' and ')} ${missing.length === 1 ? 'is' : 'are'} not on PATH.\n${INSTALL_HINT}`,
    );
  }
  const dockerProblem = await tools.dockerProblem();
  if (dockerProblem === undefined) return make.docker();
  if (source === 'docker') {
    throw new NoServersError(
      `cannot start the stack: QP_STACK_SERVERS=docker but ${dockerProblem}.\n${INSTALL_HINT}`,
    );
  }
  throw new NoServersError(
    [
      'cannot start the stack: it needs a Redis server and a NATS server, and found no way to run them:',
      ...missing.map((c) => `  - ${c} is not on PATH`),
      `  - ${dockerProblem}`,
      INSTALL_HINT,
    ].join('\n'),
  );
}
