/**
 * Backend that runs Redis and NATS in containers with testcontainers, chosen by `QP_TEST_BACKEND=containers`.
 * Host networking only (each server binds 127.0.0.1 on a free port, as the process backend does), so tests see
 * the same addresses either way. Faults map onto the container: pause/resume freeze and thaw it (cgroup freezer,
 * like SIGSTOP/SIGCONT), stop/kill end its process, and start runs the same container again on the same port
 * with the same filesystem (JetStream data survives, as with the process backend's data directory).
 *
 * Images: `REDIS_IMAGE` (default redis:7.2-alpine) and `NATS_IMAGE` (default nats:2.10-alpine); machines without
 * a registry build local ones with docker/build-local-images.sh. testcontainers is loaded only when this backend
 * is used, with `TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1` and `TESTCONTAINERS_RYUK_DISABLED=true` unless set
 * (the reaper container needs a bridge network, which these machines do not allow): every container carries
 * the label `org.quotaplane.harness` so CI can remove any a crashed run left behind.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type Dockerode from 'dockerode';
import type { GenericContainer } from 'testcontainers';
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
import { natsInfo, redisPing, until } from '../../scripts/stack/probes.js';
import { formCluster } from '../../scripts/stack/redis-cluster.js';
import { attachReplicas } from './redis-replication.js';

const HOST = '127.0.0.1';
/** Label on every container this backend starts. */
export const HARNESS_LABEL = 'org.quotaplane.harness';

function images(): { redis: string; nats: string } {
  return {
    redis: process.env['REDIS_IMAGE'] ?? 'redis:7.2-alpine',
    nats: process.env['NATS_IMAGE'] ?? 'nats:2.10-alpine',
  };
}

abstract class ContainerServer {
  readonly host = HOST;
  port = 0;
  #container: Dockerode.Container | undefined;
  #running = false;

  protected abstract image(): string;
  protected abstract command(): string[];
  protected abstract ready(): Promise<void>;
  /** Anything more the container needs before it first starts (files to copy in). */
  protected prepare(container: GenericContainer): GenericContainer {
    return container;
  }

  async start(): Promise<void> {
    if (this.#running) throw new Error('already running');
    if (this.#container === undefined) {
      process.env['TESTCONTAINERS_HOST_OVERRIDE'] ??= HOST;
      process.env['TESTCONTAINERS_RYUK_DISABLED'] ??= 'true';
      const { GenericContainer, getContainerRuntimeClient } = await import('testcontainers');
      const started = await this.prepare(new GenericContainer(this.image()))
        .withNetworkMode('host')
        .withCommand(this.command())
        .withLabels({ [HARNESS_LABEL]: String(process.pid) })
        .withAutoRemove(false)
        .start();
      const client = await getContainerRuntimeClient();
      this.#container = client.container.getById(started.getId());
    } else {
      await this.#container.start();
    }
    this.#running = true;
    let settled = false;
    try {
      await Promise.race([this.ready(), this.#exitedEarly(() => settled)]);
    } finally {
      settled = true;
    }
  }

  // Docker refuses to pause a paused container or unpause a running one (HTTP 500 "is not paused"), where
  // SIGSTOP and SIGCONT are idempotent: both ask for a state, so a test may thaw twice (in its body and in a
  // `finally`), as it may with the process backend. Calls are chained so one never races the other.
  #freezer: Promise<void> = Promise.resolve();

  pause(): Promise<void> {
    return this.#freeze(true);
  }

  resume(): Promise<void> {
    return this.#freeze(false);
  }

  #freeze(paused: boolean): Promise<void> {
    const next = this.#freezer.then(async () => {
      const container = this.#container;
      if (container === undefined) return;
      const state = (await container.inspect()).State;
      if (!state.Running || state.Paused === paused) return;
      await (paused ? container.pause() : container.unpause());
    });
    this.#freezer = next.catch(() => undefined);
    return next;
  }

  async stop(): Promise<void> {
    await this.#end(async (c) => {
      await c.stop({ t: 5 });
    });
  }

  async kill(): Promise<void> {
    await this.#end(async (c) => {
      await c.kill({ signal: 'SIGKILL' });
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    const container = this.#container;
    this.#container = undefined;
    this.#running = false;
    await container?.remove({ force: true, v: true }).catch(() => undefined);
  }

  async #end(how: (c: Dockerode.Container) => Promise<void>): Promise<void> {
    const container = this.#container;
    if (container === undefined || !this.#running) return;
    this.#running = false;
    // A frozen container can be neither stopped nor killed: thaw it first, as the process backend sends SIGCONT.
    const state = (await container.inspect()).State;
    if (state.Paused) await container.unpause();
    if (state.Running) await how(container).catch(() => undefined);
    await container.wait();
  }

  /** Rejects with the container's last lines if it exits before `done()`; polls, so nothing is left waiting. */
  async #exitedEarly(done: () => boolean): Promise<never> {
    const container = this.#container!;
    while (!done()) {
      const state = (await container.inspect()).State;
      if (!state.Running) {
        const logs = await container
          .logs({ stdout: true, stderr: true, tail: 40 })
          .then(demuxLogs, (error: unknown) => `(docker logs failed: ${String(error)})`);
        throw new ExitedEarly(`${this.image()} on port ${this.port}`, state.ExitCode, logs);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    return new Promise<never>(() => undefined);
  }
}

/**
 * A container that exited before it was ready. The message's first line (all a CI summary keeps) ends with the
 * server's last log line, its fatal error; the last lines follow.
 */
export class ExitedEarly extends Error {
  readonly logs: string;

  constructor(what: string, code: number, logs: string) {
    const lines = logs.split('\n').filter((l) => l.trim() !== '');
    const last = lines.at(-1)?.trim() ?? 'no output';
    super(`${what} exited early (code ${code}): ${last}\nits last lines (docker logs):\n${lines.join('\n')}`);
    this.name = 'ExitedEarly';
    this.logs = logs;
  }

  /** Whether it could not bind a port (another process took it between the port's choice and the start). */
  get addressInUse(): boolean {
    return /address already in use/i.test(this.logs);
  }
}

/**
 * `docker logs` of a container without a TTY: frames of an 8-byte header (stream, 0, 0, 0, length as big-endian
 * uint32) and that many bytes. Text that does not parse as frames is returned as it is.
 */
function demuxLogs(raw: Buffer | string): string {
  const buf = typeof raw === 'string' ? Buffer.from(raw, 'utf8') : raw;
  const parts: Buffer[] = [];
  let offset = 0;
  while (offset < buf.length) {
    const kind = buf[offset]!;
    if (
      offset + 8 > buf.length ||
      kind > 2 ||
      buf[offset + 1] !== 0 ||
      buf[offset + 2] !== 0 ||
      buf[offset + 3] !== 0
    )
      return buf.toString('utf8');
    const size = buf.readUInt32BE(offset + 4);
    parts.push(buf.subarray(offset + 8, offset + 8 + size));
    offset += 8 + size;
  }
  return Buffer.concat(parts).toString('utf8');
}

/**
 * A server on ports the backend drew: drawn and started again, once, if it could not bind one of them (the draw
 * only saw the port free; something else may bind it before the container starts). Nothing is left behind by a
 * start that failed.
 */
async function startOnFreshPorts<T extends AsyncDisposable>(start: () => Promise<T>): Promise<T> {
  try {
    return await start();
  } catch (error) {
    if (!(error instanceof ExitedEarly && error.addressInUse)) throw error;
    process.stderr.write(
      `[container backend] ${error.message.split('\n')[0]}; starting it again on new ports\n`,
    );
    return start();
  }
}

/** Start `server`, removing its container if it does not start. */
async function started<T extends ContainerServer>(server: T): Promise<T> {
  try {
    await server.start();
    return server;
  } catch (error) {
    await server[Symbol.asyncDispose]();
    throw error;
  }
}

class ContainerRedis extends ContainerServer implements RedisServer {
  readonly #extra: string[];

  constructor(extra: string[] = []) {
    super();
    this.#extra = extra;
  }

  get url(): string {
    return `redis://${this.host}:${this.port}`;
  }

  protected image(): string {
    return images().redis;
  }

  protected command(): string[] {
    return [
      'redis-server',
      '--port',
      String(this.port),
      '--bind',
      HOST,
      '--save',
      '',
      '--appendonly',
      'no',
      '--protected-mode',
      'no',
      ...this.#extra,
    ];
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port, 20_000);
    await until(() => redisPing(this.host, this.port), 10_000, `redis on ${this.port} never answered PING`);
  }
}

/** Where a locked-down NATS container finds its secrets bundle. */
const SECRETS_MOUNT = '/secrets';

class ContainerNats extends ContainerServer implements NatsServer {
  readonly #jetstream: boolean;
  readonly #dir: string | undefined;
  readonly security: NatsSecurity | undefined;

  constructor(options: NatsOptions = {}) {
    super();
    this.#jetstream = options.jetstream ?? true;
    if (options.secure !== undefined) {
      this.#dir = mkdtempSync(join(tmpdir(), 'qp-nats-secrets-'));
      this.security = natsSecurity(this.#dir, options.secure, {
        serverDir: SECRETS_MOUNT,
        ...(this.#jetstream ? { jetstreamDir: '/data/js' } : {}),
      });
    }
  }

  get url(): string {
    return `${this.security?.bundle.caFile !== undefined ? 'tls' : 'nats'}://${this.host}:${this.port}`;
  }

  protected image(): string {
    return images().nats;
  }

  protected override prepare(container: GenericContainer): GenericContainer {
    return this.#dir === undefined
      ? container
      : container.withCopyDirectoriesToContainer([{ source: this.#dir, target: SECRETS_MOUNT }]);
  }

  protected command(): string[] {
    const args = ['nats-server', '-a', HOST, '-p', String(this.port)];
    if (this.security !== undefined) args.push('-c', `${SECRETS_MOUNT}/nats-server.conf`);
    else if (this.#jetstream) args.push('-js', '-sd', '/data/js');
    return args;
  }

  override async [Symbol.asyncDispose](): Promise<void> {
    await super[Symbol.asyncDispose]();
    if (this.#dir !== undefined) rmSync(this.#dir, { recursive: true, force: true });
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port, 20_000);
    await until(
      async () => (await natsInfo(this.host, this.port)) !== undefined,
      10_000,
      `nats on ${this.port} never sent INFO`,
    );
  }
}

/** Where a cluster member's container sees its files. */
const NODE_MOUNT = '/node';

/** A server of a cluster, from the configuration its caller wrote (its ports are in it). */
class ContainerNatsNode extends ContainerServer implements NatsServer {
  readonly security: NatsSecurity | undefined;
  readonly #dir: string;

  constructor(spec: NatsNodeSpec) {
    super();
    this.port = spec.port;
    this.security = spec.security;
    this.#dir = spec.dir;
    writeFileSync(join(spec.dir, 'nats.conf'), spec.config({ dir: NODE_MOUNT, storeDir: '/data/js' }));
  }

  get url(): string {
    return `${this.security?.bundle.caFile !== undefined ? 'tls' : 'nats'}://${this.host}:${this.port}`;
  }

  protected image(): string {
    return images().nats;
  }

  protected override prepare(container: GenericContainer): GenericContainer {
    return container.withCopyDirectoriesToContainer([{ source: this.#dir, target: NODE_MOUNT }]);
  }

  protected command(): string[] {
    return ['nats-server', '-c', `${NODE_MOUNT}/nats.conf`];
  }

  protected async ready(): Promise<void> {
    await waitForPort(this.host, this.port, 20_000);
  }
}

class ContainerRedisCluster implements RedisCluster {
  readonly nodes: ContainerRedis[];

  constructor(nodes: ContainerRedis[]) {
    this.nodes = nodes;
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.kill()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.all(this.nodes.map((n) => n[Symbol.asyncDispose]()));
  }
}

export const containerBackend: ServerBackend = {
  name: 'containers',

  startRedis() {
    return startOnFreshPorts(async () => {
      const server = new ContainerRedis();
      server.port = await freePort();
      return started(server);
    });
  },

  startNats(options) {
    return startOnFreshPorts(async () => {
      const server = new ContainerNats(options);
      server.port = await freePort();
      return started(server);
    });
  },

  // Its ports are the caller's (its configuration and its peers' name them): no second draw here.
  startNatsNode(spec) {
    return started(new ContainerNatsNode(spec));
  },

  startRedisCluster(masters = 3, replicasPerMaster = 0) {
    return startOnFreshPorts(() => startRedisCluster(masters, replicasPerMaster));
  },
};

async function startRedisCluster(masters: number, replicasPerMaster: number): Promise<ContainerRedisCluster> {
  const nodes: ContainerRedis[] = [];
  try {
    for (let i = 0; i < masters * (1 + replicasPerMaster); i++) {
      const node = new ContainerRedis([...CLUSTER_NODE_ARGS]);
      node.port = await freeClusterPort(nodes.map((n) => n.port));
      nodes.push(node);
    }
    // Every start settled before any is removed: a container still being created would be left behind.
    const starts = await Promise.allSettled(nodes.map((n) => n.start()));
    const failed = starts.find((s) => s.status === 'rejected');
    if (failed !== undefined) throw failed.reason;
    const endpoints = nodes.map((n) => ({ host: n.host, port: n.port }));
    await formCluster(endpoints.slice(0, masters));
    if (replicasPerMaster > 0)
      await attachReplicas(endpoints.slice(0, masters), endpoints.slice(masters), 20_000);
    return new ContainerRedisCluster(nodes);
  } catch (error) {
    await Promise.all(nodes.map((n) => n[Symbol.asyncDispose]()));
    throw error;
  }
}
