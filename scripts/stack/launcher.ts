/**
 * The local stack: NATS and one Redis (or a 3-master Redis Cluster) per region, the coordinator, the demo
 * policy through the admin API, then one agent per region, each waited for until its /readyz says so. `stop()`
 * works at any moment, during the start too, and stops in dependency order: agents (they drain and say goodbye
 * to the coordinator), the coordinator, then the servers. A process that exits when nobody asked it to is
 * reported through `failure`.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import {
  ensureSecretsBundle,
  type BundleOptions,
  type SecretsBundle,
} from '../../coordinator/nats/secrets-bundle.js';
import { formatRoundTrips } from '../../core/distance.js';
import { PROXY_MAIN } from '../../test/helpers/tcp-proxy.js';
import {
  SENTINEL_PORT_OFFSET,
  sentinelMasterName,
  type GeoPlan,
  type RegionPlan,
  type StackConfig,
} from './config.js';
import { geoCluster, geoProxySpec, geoServerName } from './geo.js';
import { ManagedProcess, type ExitStatus } from './managed-process.js';
import { natsClusterFormed, natsInfo, redisPing, sentinelsKnowReplicas, until } from './probes.js';
import { formCluster } from './redis-cluster.js';
import { seedDemoPolicy, type SeedResult } from './seed.js';
import type { ServerRunner, ServerSpec } from './servers.js';
import {
  agentEnv,
  baseEnv,
  coordinatorEnv,
  natsUrl,
  serviceCommand,
  type StackSecrets,
  type StackTokens,
} from './services.js';

/** Where `npm start` keeps its secrets unless QP_STACK_SECRETS_DIR says otherwise (gitignored). */
export const DEFAULT_SECRETS_DIR = join('.quotaplane', 'secrets');

export interface StackDeps {
  readonly runner: ServerRunner;
  /** The repository root: services run from source there. */
  readonly cwd: string;
  /** The launcher's environment (children inherit it without its `QP_*` variables). */
  readonly env: NodeJS.ProcessEnv;
  /** Progress and echoed warnings, one line each. */
  readonly say: (line: string) => void;
  /** Names this stack's processes and containers; random by default. */
  readonly stackId?: string;
}

/** A process that exited on its own. */
export interface StackFailure {
  readonly name: string;
  readonly status: ExitStatus;
  readonly tail: string;
  readonly logFile: string;
}

/** What the state file holds (no tokens). */
export interface StackState {
  readonly stackId: string;
  readonly pid: number;
  readonly dataDir: string;
  /** NATS credentials, TLS material and the subject secret (`subject-hmac.key`), kept across runs. */
  readonly secretsDir: string;
  readonly servers: ServerRunner['kind'];
  readonly coordinator: string;
  /** The coordinator's NATS server (the one server of the single topology). */
  readonly nats: string;
  readonly topology: StackConfig['topology'];
  /** Geo topology: each region's NATS server, its monitoring, the links' control API and round trips. */
  readonly geo?: {
    readonly nats: Record<string, string>;
    readonly monitoring: Record<string, string>;
    readonly links: string;
    readonly roundTrips: string;
    readonly jitter: number;
  };
  readonly agents: Record<string, string>;
  /** Each agent's gRPC rate-limit service, `grpc://host:port`. */
  readonly grpc: Record<string, string>;
  readonly redis: Record<string, string>;
  readonly processes: { name: string; pid: number | undefined }[];
}

/** Thrown out of `start()` when `stop()` was called meanwhile. */
export class StackStopped extends Error {
  constructor() {
    super('the stack was stopped while starting');
    this.name = 'StackStopped';
  }
}

const STOP_TIMEOUT = { agent: 15_000, coordinator: 15_000, server: 5_000 };

function levelName(level: unknown): string | undefined {
  if (typeof level !== 'number' || level < 40) return undefined;
  return level >= 60 ? 'FATAL' : level >= 50 ? 'ERROR' : 'WARN';
}

export class Stack {
  readonly config: StackConfig;
  readonly stackId: string;
  readonly tokens: StackTokens;
  readonly dataDir: string;
  /** NATS credentials and TLS material, one nkey per process, and the subject secret; kept across runs. */
  readonly secretsDir: string;
  readonly #deps: StackDeps;
  readonly #ownDir: boolean;
  readonly #servers: ManagedProcess[] = [];
  #coordinator: ManagedProcess | undefined;
  readonly #agents: ManagedProcess[] = [];
  #stopping: Promise<void> | undefined;
  #seed: SeedResult | undefined;
  #onFailure: ((failure: StackFailure) => void) | undefined;
  #failure: Promise<StackFailure>;

  /** `config` must have its ports resolved (no 0 left). Nothing starts until `start()`. */
  constructor(config: StackConfig, deps: StackDeps) {
    this.config = config;
    this.#deps = deps;
    this.stackId = deps.stackId ?? randomBytes(4).toString('hex');
    this.tokens = {
      admin: config.adminToken ?? randomBytes(24).toString('hex'),
      read: config.readToken ?? randomBytes(24).toString('hex'),
    };
    this.#ownDir = config.dataDir === undefined;
    this.dataDir = config.dataDir ?? mkdtempSync(join(tmpdir(), 'quotaplane-stack-'));
    mkdirSync(join(this.dataDir, 'logs'), { recursive: true });
    this.secretsDir = resolve(deps.cwd, config.secretsDir ?? DEFAULT_SECRETS_DIR);
    this.#failure = new Promise((resolve) => (this.#onFailure = resolve));
  }

  /** Resolves with the first process that exits without being asked to. */
  get failure(): Promise<StackFailure> {
    return this.#failure;
  }

  get seed(): SeedResult | undefined {
    return this.#seed;
  }

  get coordinatorUrl(): string {
    return `http://${this.config.host}:${this.config.coordinatorPort}`;
  }

  agentUrl(region: RegionPlan): string {
    return `http://${this.config.host}:${region.agentPort}`;
  }

  /**
   * A region's Redis under Sentinel: the master on `ports[0]`, replicas on the others, a sentinel beside each
   * node (port + SENTINEL_PORT_OFFSET). Ready once the replicas are linked and every sentinel knows them all, so
   * a failover can happen from the first decision on.
   */
  async #startSentinelRegion(
    region: string,
    ports: readonly number[],
    spec: (name: string, port: number) => ServerSpec,
  ): Promise<void> {
    const { config } = this;
    const { runner } = this.#deps;
    const masterName = sentinelMasterName(region);
    const nodes = ports.map((port, i) =>
      this.#track(
        runner.redis(spec(`redis ${region} ${i === 0 ? 'master' : `replica ${i}`}`, port), {
          cluster: false,
          replicaOf: i === 0 ? undefined : ports[0],
        }),
        this.#servers,
        true,
      ),
    );
    await Promise.all(nodes.map((n, i) => this.#ready(n, () => redisPing(config.host, ports[i]!), 30_000)));
    this.#check();
    const sentinels = ports.map((port, i) =>
      this.#track(
        runner.sentinel(spec(`redis ${region} sentinel ${i + 1}`, port + SENTINEL_PORT_OFFSET), {
          masterName,
          masterPort: ports[0]!,
        }),
        this.#servers,
      ),
    );
    await Promise.all(
      sentinels.map((s, i) =>
        this.#ready(s, () => redisPing(config.host, ports[i]! + SENTINEL_PORT_OFFSET), 30_000),
      ),
    );
    this.#check();
    await until(
      () =>
        sentinelsKnowReplicas(
          config.host,
          ports.map((p) => p + SENTINEL_PORT_OFFSET),
          masterName,
          ports.length - 1,
        ),
      30_000,
      `the sentinels of ${region} never saw its replicas`,
    );
  }

  /** The agent's gRPC rate-limit service. */
  grpcUrl(region: RegionPlan): string {
    return `grpc://${this.config.host}:${region.grpcPort}`;
  }

  /** Every process started so far. */
  get processes(): ManagedProcess[] {
    return [...this.#servers, ...(this.#coordinator ? [this.#coordinator] : []), ...this.#agents];
  }

  async start(): Promise<void> {
    const { config } = this;
    const { say, runner } = this.#deps;
    const base = baseEnv(this.#deps.env, this.stackId);

    say(`stack ${this.stackId}: logs in ${this.dataDir}/logs`);
    say(`starting NATS and Redis (${runner.description})`);
    const serverDir = (name: string) => {
      const dir = join(this.dataDir, name);
      mkdirSync(dir, { recursive: true });
      // Redis keeps no data here (no snapshots), so a cluster is formed afresh every time; a kept directory's
      // cluster file would name the nodes' earlier ports.
      rmSync(join(dir, 'nodes.conf'), { force: true });
      return dir;
    };
    const spec = (name: string, port: number) => ({
      name,
      host: config.host,
      port,
      dir: serverDir(name.replace(/ /g, '-')),
      logFile: this.#logFile(name),
      env: base,
    });
    const waits: Promise<void>[] = [];
    let secrets: SecretsBundle;
    const geo = config.geo;
    if (geo === undefined) {
      const natsSpec = spec('nats', config.natsPort);
      secrets = this.#secrets(runner.natsView(natsSpec, this.secretsDir), join(natsSpec.dir, 'nats.conf'), {
        port: config.natsPort,
      });
      const nats = this.#track(
        runner.nats(natsSpec, { configFile: secrets.configFile, secretsDir: this.secretsDir }),
        this.#servers,
      );
      waits.push(this.#natsReady(nats, config.natsPort));
    } else {
      const started = this.#startGeo(geo, spec, base);
      secrets = started.secrets;
      waits.push(started.ready);
    }
    const access: StackSecrets = {
      caFile: secrets.caFile!,
      nkeyFile: (identity) => secrets.nkeyFile(identity),
      subjectSecret:
        config.hmacSecret !== undefined
          ? { QP_HMAC_SECRET: config.hmacSecret }
          : { QP_HMAC_SECRET_FILE: secrets.hmacKeyFile },
    };
    for (const region of config.regions) {
      if (region.redis.kind === 'single') {
        const port = region.redis.port;
        const redis = this.#track(
          runner.redis(spec(`redis ${region.name}`, port), { cluster: false }),
          this.#servers,
        );
        waits.push(this.#ready(redis, () => redisPing(config.host, port), 30_000));
      } else if (region.redis.kind === 'sentinel') {
        waits.push(this.#startSentinelRegion(region.name, region.redis.ports, spec));
      } else {
        const ports = region.redis.ports;
        const nodes = ports.map((port, i) =>
          this.#track(
            runner.redis(spec(`redis ${region.name} node ${i + 1}`, port), { cluster: true }),
            this.#servers,
          ),
        );
        waits.push(
          (async () => {
            await Promise.all(
              nodes.map((n, i) => this.#ready(n, () => redisPing(config.host, ports[i]!), 30_000)),
            );
            this.#check();
            await formCluster(ports.map((port) => ({ host: config.host, port })));
          })(),
        );
      }
    }
    await Promise.all(waits);
    this.#check();

    say(`starting the coordinator on ${this.coordinatorUrl}`);
    const coordinator = this.#service(
      'coordinator',
      'coordinator/main.ts',
      coordinatorEnv(config, this.tokens, base, access),
    );
    this.#coordinator = coordinator;
    await this.#ready(coordinator, () => this.#httpReady(this.coordinatorUrl), config.readyTimeoutMs);
    this.#check();

    if (config.seed) {
      this.#seed = await seedDemoPolicy(this.coordinatorUrl, this.tokens.admin);
      say(
        `${this.#seed.created ? 'created' : 'kept the existing'} demo policy "${String(this.#seed.policy['name'])}"`,
      );
      this.#check();
    }

    say(`starting the agents (${config.regions.map((r) => `${r.name} ${this.agentUrl(r)}`).join(', ')})`);
    const agents = config.regions.map((region) => {
      const agent = this.#service(
        `agent ${region.name}`,
        'regional-agent/main.ts',
        agentEnv(config, region, base, access),
      );
      this.#agents.push(agent);
      return { region, agent };
    });
    await Promise.all(
      agents.map(({ region, agent }) =>
        this.#ready(agent, () => this.#httpReady(this.agentUrl(region)), config.readyTimeoutMs),
      ),
    );
    this.#check();
    if (config.envFile !== undefined) {
      mkdirSync(dirname(config.envFile), { recursive: true, mode: 0o700 });
      writeAtomically(config.envFile, this.envFile());
    }
    if (config.stateFile !== undefined) {
      writeAtomically(config.stateFile, JSON.stringify(this.state(), null, 2) + '\n');
    }
  }

  /**
   * The shell file another terminal sources to talk to this stack: its tokens (given or generated) and the
   * coordinator's address, as the curl examples and the CLI read them.
   */
  envFile(): string {
    const quote = (v: string) => `'${v.replace(/'/g, `'\\''`)}'`;
    return [
      `# quotaplane stack ${this.stackId} (pid ${process.pid}): its tokens, coordinator and agents, for another shell:`,
      '#   source <this file>',
      '# Removed when the stack stops.',
      `export QP_ADMIN_TOKEN=${quote(this.tokens.admin)}`,
      `export QP_READ_TOKEN=${quote(this.tokens.read)}`,
      `export QUOTAPLANE_URL=${quote(this.coordinatorUrl)}`,
      // Every agent, as `quotaplane explain` reads them (docs/cli.md).
      `export QUOTAPLANE_AGENTS=${quote(this.config.regions.map((r) => `${r.name}=${this.agentUrl(r)}`).join(','))}`,
      '',
    ].join('\n');
  }

  /** Endpoints and process ids. */
  state(): StackState {
    const { config } = this;
    return {
      stackId: this.stackId,
      pid: process.pid,
      dataDir: this.dataDir,
      secretsDir: this.secretsDir,
      servers: this.#deps.runner.kind,
      coordinator: this.coordinatorUrl,
      nats: natsUrl(config),
      topology: config.topology,
      ...(config.geo === undefined
        ? {}
        : {
            geo: {
              nats: Object.fromEntries(config.geo.servers.map((s) => [s.region, natsUrl(config, s.region)])),
              monitoring: Object.fromEntries(
                config.geo.servers.map((s) => [s.region, `http://${config.host}:${s.monitorPort}`]),
              ),
              links: this.linksUrl!,
              roundTrips: formatRoundTrips(
                config.geo.roundTrips,
                config.regions.map((r) => r.name),
              ),
              jitter: config.geo.jitter,
            },
          }),
      agents: Object.fromEntries(config.regions.map((r) => [r.name, this.agentUrl(r)])),
      grpc: Object.fromEntries(config.regions.map((r) => [r.name, this.grpcUrl(r)])),
      redis: Object.fromEntries(
        config.regions.map((r) => [
          r.name,
          r.redis.kind === 'single'
            ? `redis://${config.host}:${r.redis.port}`
            : r.redis.kind === 'cluster'
              ? `cluster ${r.redis.ports.map((p) => `${config.host}:${p}`).join(',')}`
              : `sentinel ${sentinelMasterName(r.name)} ${r.redis.ports.map((p) => `${config.host}:${p + SENTINEL_PORT_OFFSET}`).join(',')}`,
        ]),
      ),
      processes: this.processes.map((p) => ({ name: p.name, pid: p.pid })),
    };
  }

  /**
   * Stop every process in dependency order and remove the data directory (unless it was given or is to be
   * kept, or `keepData` asks to keep it for a post-mortem). Safe to call more than once and during `start()`.
   */
  stop(options: { keepData?: boolean } = {}): Promise<void> {
    return (this.#stopping ??= (async () => {
      await Promise.all(this.#agents.map((p) => p.stop(STOP_TIMEOUT.agent)));
      await this.#coordinator?.stop(STOP_TIMEOUT.coordinator);
      await Promise.all(this.#servers.map((p) => p.stop(STOP_TIMEOUT.server)));
      await this.#deps.runner.cleanup();
      if (this.config.stateFile !== undefined) rmSync(this.config.stateFile, { force: true });
      // Only our own: another stack started later in the same directory may have written its own since.
      const env = this.config.envFile;
      if (env !== undefined && existsSync(env) && readFileSync(env, 'utf8') === this.envFile()) {
        rmSync(env, { force: true });
      }
      if (this.#ownDir && !this.config.keepData && options.keepData !== true) {
        rmSync(this.dataDir, { recursive: true, force: true });
      }
    })());
  }

  /** SIGKILL everything at once (a second Ctrl-C). */
  kill(): void {
    for (const p of this.processes) p.kill();
  }

  /**
   * The secrets bundle (made on the first start, kept after) and this run's NATS configuration, written in the
   * run's own directory so stacks sharing the secrets directory never share a configuration.
   */
  #secrets(
    view: { secretsDir: string; storeDir: string },
    configFile: string,
    server: Pick<BundleOptions, 'port' | 'monitorPort' | 'serverName' | 'cluster'>,
  ): SecretsBundle {
    const { config } = this;
    return ensureSecretsBundle(this.secretsDir, {
      namespace: config.namespace,
      regions: config.regions.map((r) => r.name),
      tls: { altNames: [...new Set([config.host, '127.0.0.1', 'localhost'])] },
      host: config.host,
      serverDir: view.secretsDir,
      jetstreamDir: view.storeDir,
      configFile,
      ...server,
    });
  }

  /** A NATS server is ready once it says JetStream is on. */
  #natsReady(nats: ManagedProcess, port: number): Promise<void> {
    return this.#ready(
      nats,
      async () => (await natsInfo(this.config.host, port))?.['jetstream'] === true,
      30_000,
    );
  }

  /**
   * The geo topology's links (one proxy process; every port is fixed by the plan, so the servers' configurations
   * name them at once) and one NATS server per region, each routing to the others through the links. `ready`
   * resolves once the links answer, every server runs JetStream and the cluster has formed through the links.
   */
  #startGeo(
    geo: GeoPlan,
    spec: (name: string, port: number) => ServerSpec,
    base: NodeJS.ProcessEnv,
  ): { secrets: SecretsBundle; ready: Promise<void> } {
    const { config } = this;
    const { runner, cwd } = this.#deps;
    const regions = geo.servers.map((s) => s.region);
    const routePort = (region: string) => geo.servers.find((s) => s.region === region)!.routePort;
    const linkPort = (from: string, to: string) =>
      geo.links.find((l) => l.from === from && l.to === to)!.port;
    const proxySpec = geoProxySpec({
      host: config.host,
      regions,
      roundTrips: geo.roundTrips,
      jitter: geo.jitter,
      routePort,
      linkPort,
      controlPort: geo.controlPort,
    });
    const links = this.#track(
      new ManagedProcess({
        name: 'links',
        command: process.execPath,
        args: ['--import', 'tsx', PROXY_MAIN, JSON.stringify(proxySpec)],
        env: base,
        cwd,
        logFile: this.#logFile('links'),
      }),
      this.#servers,
    );
    const bundles = geo.servers.map((server) => {
      const natsSpec = spec(`nats ${server.region}`, server.port);
      const bundle = this.#secrets(
        runner.natsView(natsSpec, this.secretsDir),
        join(natsSpec.dir, 'nats.conf'),
        {
          port: server.port,
          monitorPort: server.monitorPort,
          serverName: geoServerName(server.region),
          cluster: geoCluster(config.host, server.region, regions, server.routePort, linkPort),
        },
      );
      const nats = this.#track(
        runner.nats(natsSpec, { configFile: bundle.configFile, secretsDir: this.secretsDir }),
        this.#servers,
      );
      return { bundle, ready: this.#natsReady(nats, server.port) };
    });
    const monitors = geo.servers.map((s) => `http://${config.host}:${s.monitorPort}`);
    const ready = (async () => {
      await this.#ready(links, () => this.#httpOk(`${this.linksUrl!}/links`), 30_000);
      await Promise.all(bundles.map((b) => b.ready));
      // Routes retry about once a second and JetStream elects its meta leader over the links' round trips.
      await this.#ready(links, () => natsClusterFormed(monitors), 60_000);
    })();
    return { secrets: bundles[0]!.bundle, ready };
  }

  /** The links' control API (geo topology only). */
  get linksUrl(): string | undefined {
    const geo = this.config.geo;
    return geo === undefined ? undefined : `http://${this.config.host}:${geo.controlPort}`;
  }

  async #httpOk(url: string): Promise<boolean> {
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
      await r.body?.cancel();
      return r.status === 200;
    } catch {
      return false;
    }
  }

  #check(): void {
    if (this.#stopping !== undefined) throw new StackStopped();
  }

  #logFile(name: string): string {
    return join(this.dataDir, 'logs', `${name.replace(/ /g, '-')}.log`);
  }

  /**
   * Keep `child` among the stack's processes; its exit stops the stack, unless it is `expendable` (a Redis node
   * of a Sentinel region: its death is a failover to watch, announced and survived).
   */
  #track(child: ManagedProcess, into: ManagedProcess[], expendable = false): ManagedProcess {
    into.push(child);
    void child.exited.then((status) => {
      if (child.stopping || this.#stopping !== undefined) return;
      if (expendable) {
        const how = status.signal !== null ? `signal ${status.signal}` : `code ${status.code}`;
        this.#deps.say(
          `${child.name} exited (${how}); its sentinels promote a replica and the agent follows`,
        );
        return;
      }
      this.#onFailure?.({ name: child.name, status, tail: child.tail(), logFile: child.logFile });
    });
    return child;
  }

  #service(name: string, entry: 'coordinator/main.ts' | 'regional-agent/main.ts', env: NodeJS.ProcessEnv) {
    const { command, args } = serviceCommand(entry, this.config.runtime);
    const child = new ManagedProcess({
      name,
      command,
      args,
      env,
      cwd: this.#deps.cwd,
      logFile: this.#logFile(name),
      onLine: (line) => this.#echo(name, line),
    });
    return this.#track(child, []);
  }

  /** Warnings and errors of a service reach the console; the rest stays in its log file. */
  #echo(name: string, line: string): void {
    if (!line.startsWith('{')) return;
    try {
      const entry = JSON.parse(line) as { level?: unknown; msg?: string; err?: { message?: unknown } };
      const level = levelName(entry.level);
      if (level === undefined) return;
      const err = typeof entry.err?.message === 'string' ? `: ${entry.err.message}` : '';
      this.#deps.say(`[${name}] ${level} ${String(entry.msg ?? '')}${err}`);
    } catch {
      // not a log line
    }
  }

  async #httpReady(url: string): Promise<boolean> {
    try {
      const r = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
      await r.body?.cancel();
      return r.status === 200;
    } catch {
      return false;
    }
  }

  /** Wait until `probe` says ready, failing at once if the process exits or the stack is stopped. */
  async #ready(child: ManagedProcess, probe: () => Promise<boolean>, timeoutMs: number): Promise<void> {
    let exited: ExitStatus | undefined;
    void child.exited.then((s) => (exited = s));
    await until(
      async () => {
        this.#check();
        if (exited !== undefined) {
          const how = exited.signal !== null ? `signal ${exited.signal}` : `code ${exited.code}`;
          throw new Error(
            `${child.name} exited (${how}) before it was ready; its last lines (${child.logFile}):\n${child.tail()}`,
          );
        }
        return probe();
      },
      timeoutMs,
      `${child.name} was not ready in time; its log: ${child.logFile}`,
    );
  }
}

/** Written aside and renamed, so a reader polling for the file never sees half of it; only its owner reads it. */
function writeAtomically(path: string, text: string): void {
  const partial = `${path}.${process.pid}.tmp`;
  writeFileSync(partial, text, { mode: 0o600 });
  renameSync(partial, path);
}
