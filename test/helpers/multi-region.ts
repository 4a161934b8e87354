/**
 * Whole agents (startAgent, HTTP included) in three regions with a coordinator, on real NATS and one Redis per
 * region, in one test process: the deployment `npm start` runs, minus the process boundaries. Lease timing is
 * compressed so failures play out in seconds.
 */
import { pino, type Logger } from 'pino';
import { formatRoundTrips } from '../../core/distance.js';
import { protocolEngine } from '../../coordinator/protocol/protocol-engine.js';
import type { LeaseSettingsInput } from '../../core/lease/settings.js';
import type { RebalanceSettingsInput } from '../../core/rebalance/settings.js';
import { startCoordinator, type RunningCoordinator } from '../../coordinator/server.js';
import { AgentConfig } from '../../regional-agent/config.js';
import { startAgent, type RunningAgent } from '../../regional-agent/start.js';
import type { NatsServer, RedisServer } from '../harness/backend.js';
import { backend } from '../harness/fixtures.js';
import { ADMIN_TOKEN, testConfig } from './coordinator-fixture.js';
import type { GeoTopology } from './geo-topology.js';
import { FAST_LEASE, FAST_REBALANCE } from './protocol-stack.js';
import { eventually } from './wait.js';

/** A strict policy homed in us, 5 tokens with next to no refill: exact counts for the length of a test. */
export const STRICT_REFUNDS = {
  mode: 'strict',
  homeRegion: 'us',
  capacity: 5,
  refillPerSecond: 0.001,
  idleTtlSeconds: 10_000,
} as const;

export interface RegionAgent {
  region: string;
  running: RunningAgent;
  url: string;
}

export interface MultiRegionOptions {
  regions?: string[];
  agentsPerRegion?: number;
  /** Agent config overrides (deadline, …). */
  agent?: Partial<Record<string, unknown>>;
  /** NATS locked down as a deployment runs it (nkeys, per-role permissions), with TLS when `tls`. */
  secure?: { tls: boolean };
  /** Rebalancing settings of the coordinator (default FAST_REBALANCE); a long round keeps shares still. */
  rebalance?: RebalanceSettingsInput;
  /** Lease settings of the coordinator over FAST_LEASE (e.g. a short forgetAfterMs). */
  lease?: LeaseSettingsInput;
  /** The agents' logger (default: silent), e.g. to read what they log. */
  log?: Logger;
  /**
   * Run on regions a WAN apart (test/helpers/geo-topology.ts): each region's agents on its own NATS server and
   * Redis, the coordinator on `coordinatorRegion`'s server. The topology's regions are the run's; it stays the
   * caller's to stop. Without it: one NATS server and one Redis per region, on loopback.
   */
  geo?: GeoTopology;
  /** Region whose NATS server the coordinator connects to, with `geo` (default the first region). */
  coordinatorRegion?: string;
  /** The KV namespace (default a random one): a locked-down `geo` topology's, whose permissions name it. */
  namespace?: string;
}

export class MultiRegion implements AsyncDisposable {
  readonly regions: string[];
  readonly agents: RegionAgent[] = [];
  /** The NATS server (the coordinator's region's, with `geo`). */
  nats!: NatsServer;
  readonly redis = new Map<string, RedisServer>();
  coordinator!: RunningCoordinator;
  readonly namespace: string;
  readonly #options: MultiRegionOptions;
  #instance = 0;
  readonly #perRegion = new Map<string, number>();

  constructor(options: MultiRegionOptions = {}) {
    this.#options = options;
    this.namespace = options.namespace ?? `m${Math.random().toString(36).slice(2, 10)}`;
    this.regions =
      options.geo !== undefined ? [...options.geo.regions] : (options.regions ?? ['us', 'eu', 'ap']);
  }

  /** The NATS URL clients of `region` connect to. */
  natsUrl(region: string): string {
    return this.#options.geo?.natsUrl(region) ?? this.nats.url;
  }

  async start(): Promise<this> {
    const b = backend();
    const secure = this.#options.secure;
    const geo = this.#options.geo;
    if (geo !== undefined) {
      // A locked-down topology's credentials serve (startGeoTopology's `secure`, with this namespace).
      if (secure !== undefined) throw new Error('with geo, lock the topology down (startGeoTopology secure)');
      this.nats = geo.nats(this.#options.coordinatorRegion ?? this.regions[0]!);
      for (const region of this.regions) this.redis.set(region, geo.redis(region));
    } else {
      this.nats = await b.startNats({
        jetstream: true,
        ...(secure !== undefined
          ? {
              secure: {
                namespace: this.namespace,
                regions: this.regions,
                // Room for agents a test starts later (restarts, replacements).
                agentsPerRegion: (this.#options.agentsPerRegion ?? 2) + 2,
                tls: secure.tls,
              },
            }
          : {}),
      });
      for (const region of this.regions) this.redis.set(region, await b.startRedis());
    }
    const bundle = this.nats.security?.bundle;
    this.coordinator = await startCoordinator(
      {
        ...testConfig({ natsUrl: this.nats.url, regions: this.regions, namespace: this.namespace }),
        ...(bundle !== undefined
          ? { natsAuth: { nkeyFile: bundle.nkeyFile('coordinator'), tlsCaFile: bundle.caFile } }
          : {}),
      },
      {
        engine: protocolEngine({
          lease: { ...FAST_LEASE, ...this.#options.lease },
          rebalance: this.#options.rebalance ?? FAST_REBALANCE,
        }),
      },
    );
    for (const region of this.regions) {
      for (let i = 0; i < (this.#options.agentsPerRegion ?? 2); i++) await this.startAgent(region);
    }
    return this;
  }

  async startAgent(region: string): Promise<RegionAgent> {
    const redis = this.redis.get(region)!;
    const n = (this.#perRegion.get(region) ?? 0) + 1;
    this.#perRegion.set(region, n);
    const bundle = this.nats.security?.bundle;
    const config = AgentConfig.parse({
      ...(bundle !== undefined
        ? { natsNkeyFile: bundle.nkeyFile(`agent-${region}-${n}`), natsTlsCaFile: bundle.caFile }
        : {}),
      region,
      redisUrl: redis.url,
      natsUrl: [this.natsUrl(region)],
      kvNamespace: this.namespace,
      instance: `${region}-${++this.#instance}`,
      port: 0,
      logLevel: 'silent',
      // On the geo topology each agent knows its round trips, as `npm start -- --geo` tells its agents.
      ...(this.#options.geo === undefined
        ? {}
        : { roundTrips: formatRoundTrips(this.#options.geo.roundTrips, this.regions) }),
      ...this.#options.agent,
    });
    const running = await startAgent(config, this.#options.log ?? pino({ level: 'silent' }));
    const agent = { region, running, url: running.url };
    this.agents.push(agent);
    return agent;
  }

  async stopAgent(agent: RegionAgent): Promise<void> {
    this.agents.splice(this.agents.indexOf(agent), 1);
    await agent.running.agent.close();
  }

  inRegion(region: string): RegionAgent[] {
    return this.agents.filter((a) => a.region === region);
  }

  async admin(method: string, path: string, body?: unknown): Promise<Response> {
    return fetch(`${this.coordinator.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: body === undefined ? null : JSON.stringify(body),
    });
  }

  async putPolicy(name: string, body: Record<string, unknown>): Promise<void> {
    const res = await this.admin('PUT', `/v1/policies/${name}`, body);
    if (res.status >= 300) throw new Error(`PUT ${name}: ${res.status} ${await res.text()}`);
  }

  /** Wait until every agent is ready and knows `policies`. */
  async ready(policies: string[], timeoutMs = 15_000): Promise<void> {
    const started = performance.now();
    for (const a of this.agents) {
      let status: number | undefined;
      await eventually(
        async () => {
          const res = await fetch(`${a.url}/readyz`).catch(() => undefined);
          status = res?.status;
          const known = policies.every(
            (p) => a.running.agent.service !== undefined && a.running.coordination?.policies.current().has(p),
          );
          return res?.status === 200 && known;
        },
        // `timeoutMs` for all the agents together.
        Math.max(0, timeoutMs - (performance.now() - started)),
        `agent ${a.region} ${a.url} ready and knowing ${policies.join(', ')}`,
        50,
      ).catch((error: unknown) => {
        throw new Error(`agent ${a.region} ${a.url} not ready (status ${String(status)})`, { cause: error });
      });
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const a of [...this.agents]) await a.running.agent.close().catch(() => undefined);
    await this.coordinator?.stop().catch(() => undefined);
    if (this.#options.geo !== undefined) return;
    for (const r of this.redis.values()) await r[Symbol.asyncDispose]();
    await this.nats?.[Symbol.asyncDispose]();
  }
}

/** POST /v1/decisions and parse the answer. */
export async function decide(
  url: string,
  body: unknown,
): Promise<{
  status: number;
  body: {
    allowed?: boolean;
    results?: { reason?: string; allowed: boolean }[];
    replayed?: boolean;
    code?: string;
    /** A 503 AGT_ERR_OVERLOADED's path (core/wire/agent.ts SHED_PATHS) and words. */
    shed?: string;
    detail?: string;
  };
}> {
  const res = await fetch(`${url}/v1/decisions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as never };
}
