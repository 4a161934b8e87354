/**
 * Backend that runs `redis-server` and `nats-server` from PATH as child processes on free loopback ports
 * (the nats.js launcher pattern: temporary directory, ports file, early exit raced against readiness).
 */
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type {
  NatsNodeSpec,
  NatsOptions,
  NatsSecurity,
  NatsServer,
  RedisCluster,
  RedisServer,
  ServerBackend,
} from './backend.js';
import { natsSecurity } from './nats-security.js';
import { CLUSTER_NODE_ARGS, freeClusterPort, freePort, waitForPort } from './ports.js';
import { waitReplicasInSync } from './redis-replication.js';

const exec = promisify(execFile);
const HOST = '127.0.0.1';

/** Every child this process started, killed on exit even if a test forgot to stop one. */
const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

function waitExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

export abstract class ProcessServer {
  readonly host = HOST;
  port = 0;
  protected child: ChildProcess | undefined;
  protected readonly dir: string;
  protected output = '';

  constructor(prefix: string) {
    this.dir = mkdtempSync(join(tmpdir(), prefix));
  }

  protected abstract command(): { bin: string; args: string[] };
  protected abstract ready(): Promise<void>;

  async start(): Promise<void> {
    if (this.child !== undefined) throw new Error('already running');
    const { bin, args } = this.command();
    const child = spawn(bin, args, { cwd: this.dir, stdio: ['ignore', 'pipe', 'pipe'] });
    this.output = '';
    child.stdout?.on('data', (d: Buffer) => (this.output = (this.output + d.toString()).slice(-4000)));
    child.stderr?.on('data', (d: Buffer) => (this.output = (this.output + d.toString()).slice(-4000)));
    live.add(child);
    child.once('exit', () => live.delete(child));
    this.child = child;
    const exited = new Promise<never>((_, reject) => {
      child.once('exit', (code, signal) =>
        reject(new Error(`${bin} exited early (code ${code}, signal ${signal}):\n${this.output}`)),
      );
      child.once('error', reject);
    });
    exited.catch(() => undefined);
    await Promise.race([this.ready(), exited]);
  }

  /** Freeze the server (SIGSTOP) and return once the kernel shows it stopped, so nothing answers after. */
  async pause(): Promise<void> {
    this.child?.kill('SIGSTOP');
    await this.#state((stopped) => stopped);
  }

  async resume(): Promise<void> {
    this.child?.kill('SIGCONT');
    await this.#state((stopped) => !stopped);
  }

  /** Wait (bounded, 2 s) until the process's state in /proc says stopped or not, as `want` asks. */
  async #state(want: (stopped: boolean) => boolean): Promise<void> {
    const pid = this.child?.pid;
    if (pid === undefined) return;
    for (let i = 0; i < 200; i++) {
      let stat: string;
      try {
        stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      } catch {
        return; // no /proc (or the process is gone): nothing to wait for
      }
      // pid (comm) STATE …: the state follows the last ')', the name may hold spaces or parentheses.
      const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      if (want(state === 'T' || state === 't')) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`process ${pid} did not reach the wanted state within 2 s`);
  }

  async stop(): Promise<void> {
    await this.#end('SIGTERM');
  }

  async kill(): Promise<void> {
    await this.#end('SIGKILL');
  }

  async #end(signal: NodeJS.Signals): Promise<void> {
    const child = this.child;
    if (child === undefined) return;
    this.child = undefined;
    const exited = waitExit(child);
    child.kill('SIGCONT');
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class ProcessRedis extends ProcessServer implements RedisServer {
  readonly #extra: string[];

  constructor(extra: string[] = []) {
    super('qp-redis-');
    this.#extra = extra;
  }

  get url(): string {
    return `redis://${this.host}:${this.port}`;
  }

  protected command() {
    return {
      bin: 'redis-server',
      args: [
        '--port',
        String(this.port),
        '--bind',
        HOST,
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        this.dir,
        '--protected-mode',
        'no',
        ...this.#extra,
      ],
    };
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port);
    // Accepting TCP is not the same as serving: wait for PING (loading, cluster boot).
    for (let i = 0; i < 200; i++) {
      try {
        const { stdout } = await exec('redis-cli', ['-h', this.host, '-p', String(this.port), 'PING']);
        if (stdout.trim() === 'PONG') return;
      } catch {
        // not yet
      }
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`redis on ${this.port} never answered PING`);
  }

  async init(): Promise<this> {
    this.port = await freePort();
    await this.start();
    return this;
  }
}

class ProcessNats extends ProcessServer implements NatsServer {
  readonly #jetstream: boolean;
  readonly security: NatsSecurity | undefined;

  constructor(options: NatsOptions = {}) {
    super('qp-nats-');
    this.#jetstream = options.jetstream ?? true;
    this.security =
      options.secure === undefined
        ? undefined
        : natsSecurity(join(this.dir, 'secrets'), options.secure, {
            ...(this.#jetstream ? { jetstreamDir: join(this.dir, 'js') } : {}),
          });
  }

  get url(): string {
    return `${this.security?.bundle.caFile !== undefined ? 'tls' : 'nats'}://${this.host}:${this.port}`;
  }

  protected command() {
    // First start: -p -1 lets the server pick a port and report it in a ports file; restarts reuse it.
    const args = ['-a', HOST, '-p', this.port === 0 ? '-1' : String(this.port), '--ports_file_dir', this.dir];
    if (this.security !== undefined) args.unshift('-c', this.security.bundle.configFile);
    else if (this.#jetstream) args.push('-js', '-sd', join(this.dir, 'js'));
    return { bin: 'nats-server', args };
  }

  protected async ready(): Promise<void> {
    if (this.port === 0) {
      for (let i = 0; i < 400 && this.port === 0; i++) {
        const file = readdirSync(this.dir).find((f) => f.endsWith('.ports'));
        if (file !== undefined) {
          let ports: { nats?: string[] } = {};
          try {
            ports = JSON.parse(readFileSync(join(this.dir, file), 'utf8')) as { nats?: string[] };
          } catch {
            // The server is still writing the file: read it again on the next turn.
          }
          const url = ports.nats?.[0];
          if (url !== undefined) this.port = Number(new URL(url).port);
        }
        if (this.port === 0) await new Promise((r) => setTimeout(r, 25));
      }
      if (this.port === 0) throw new Error('nats-server wrote no ports file');
    }
    await waitForPort(this.host, this.port);
  }

  override async start(): Promise<void> {
    for (const f of existsSync(this.dir) ? readdirSync(this.dir) : []) {
      if (f.endsWith('.ports')) rmSync(join(this.dir, f));
    }
    await super.start();
  }
}

/** A server of a cluster, from the configuration its caller wrote (its ports are in it). */
class ProcessNatsNode extends ProcessServer implements NatsServer {
  readonly security: NatsSecurity | undefined;
  readonly #configFile: string;

  constructor(spec: NatsNodeSpec) {
    super('qp-nats-node-');
    this.port = spec.port;
    this.security = spec.security;
    this.#configFile = join(spec.dir, 'nats.conf');
    writeFileSync(this.#configFile, spec.config({ dir: spec.dir, storeDir: join(this.dir, 'js') }));
  }

  get url(): string {
    return `${this.security?.bundle.caFile !== undefined ? 'tls' : 'nats'}://${this.host}:${this.port}`;
  }

  protected command() {
    return { bin: 'nats-server', args: ['-c', this.#configFile] };
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port);
  }
}

class ProcessRedisCluster implements RedisCluster {
  readonly nodes: ProcessRedis[];

  constructor(nodes: ProcessRedis[]) {
    this.nodes = nodes;
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.kill()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.all(this.nodes.map((n) => n[Symbol.asyncDispose]()));
  }
}

export async function waitClusterOk(nodes: readonly RedisServer[]): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const states = await Promise.all(
      nodes.map(async (n) => {
        const { stdout } = await exec('redis-cli', ['-h', n.host, '-p', String(n.port), 'CLUSTER', 'INFO']);
        return /cluster_state:ok/.test(stdout);
      }),
    );
    if (states.every(Boolean)) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('redis cluster never reached cluster_state:ok');
}

export const processBackend: ServerBackend = {
  name: 'process',

  async startRedis() {
    return new ProcessRedis().init();
  },

  async startNats(options) {
    const server = new ProcessNats(options);
    await server.start();
    return server;
  },

  async startNatsNode(spec) {
    const server = new ProcessNatsNode(spec);
    await server.start();
    return server;
  },

  async startRedisCluster(masters = 3, replicasPerMaster = 0) {
    const nodes: ProcessRedis[] = [];
    for (let i = 0; i < masters * (1 + replicasPerMaster); i++) {
      const node = new ProcessRedis([...CLUSTER_NODE_ARGS]);
      // Redis refuses cluster mode above port 55535 (its bus is port + 10000): a plain free port often is.
      node.port = await freeClusterPort(nodes.map((n) => n.port));
      nodes.push(node);
    }
    await Promise.all(nodes.map((n) => n.start()));
    await exec('redis-cli', [
      '--cluster',
      'create',
      ...nodes.map((n) => `${n.host}:${n.port}`),
      '--cluster-replicas',
      String(replicasPerMaster),
      '--cluster-yes',
    ]);
    await waitClusterOk(nodes);
    // A replica promotes itself only once it has synced.
    if (replicasPerMaster > 0) await waitReplicasInSync(nodes, masters * replicasPerMaster, 15_000);
    return new ProcessRedisCluster(nodes);
  },
};
