/**
 * A multi-region protocol stack on real servers, in one test process: one NATS (JetStream), one Redis per region,
 * a coordinator with the protocol engine, and agents (LeaseHolder + RedisBucketStore + KvPolicySource) that make
 * decisions at a set demand, record every admission, and report usage. The conservation checker watches every
 * agent's shares in force. Timings are compressed (sub-second rounds and leases) so tests take seconds.
 */
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { Redis } from 'ioredis';
import { systemClock } from '../../core/clock.js';
import { bucketKey } from '../../core/keys.js';
import type { LeaseSettingsInput } from '../../core/lease/settings.js';
import type { Policy } from '../../core/policy/policy.js';
import type { RebalanceSettingsInput } from '../../core/rebalance/settings.js';
import { protocolEngine } from '../../coordinator/protocol/protocol-engine.js';
import { startCoordinator, type RunningCoordinator } from '../../coordinator/server.js';
import { LeaseHolder } from '../../regional-agent/leases/lease-holder.js';
import { KvPolicySource } from '../../regional-agent/policies/kv-policy-source.js';
import { RedisBucketStore } from '../../regional-agent/redis/bucket-store.js';
import { UsageRecorder } from '../../regional-agent/reporting/usage-recorder.js';
import type { NatsServer, RedisServer } from '../harness/backend.js';
import { ConservationChecker } from '../harness/conservation-checker.js';
import { backend } from '../harness/fixtures.js';
import { ADMIN_TOKEN, testConfig } from './coordinator-fixture.js';
import { eventually } from './wait.js';

export const FAST_LEASE: LeaseSettingsInput = {
  leaseMs: 1500,
  graceMs: 4000,
  skewMs: 250,
  reportIntervalMs: 200,
};
/**
 * Rebalancing compressed for tests: short rounds and half-life, and moves confirmed after 2 s (a deployment waits
 * a minute for a split of demand that lasts; these tests exercise the moves themselves).
 */
export const FAST_REBALANCE: RebalanceSettingsInput = {
  roundMs: 200,
  demandHalfLifeMs: 400,
  confirmMs: 2000,
};

export interface Admission {
  at: number;
  cost: number;
  region: string;
}

export class StackAgent {
  readonly region: string;
  readonly instance: string;
  nc!: NatsConnection;
  holder!: LeaseHolder;
  policies!: KvPolicySource;
  store!: RedisBucketStore;
  /** Decisions per second this agent makes (0 stops it). */
  rate = 0;
  decisions = 0;
  failures = 0;
  #running = false;
  #loop: Promise<void> | undefined;
  readonly #stack: ProtocolStack;
  readonly #redis: RedisServer;
  #seq = 0;

  constructor(stack: ProtocolStack, region: string, instance: string, redis: RedisServer) {
    this.#stack = stack;
    this.region = region;
    this.instance = instance;
    this.#redis = redis;
  }

  async start(): Promise<void> {
    this.nc = await connect({
      servers: this.#stack.nats.url,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
    });
    const usage = new UsageRecorder(systemClock.now());
    this.holder = new LeaseHolder({
      nc: this.nc,
      region: this.region,
      instance: this.instance,
      clock: systemClock,
      namespace: this.#stack.namespace,
      usage,
      skewMs: 250,
      startupWaitMs: 1000,
    });
    this.policies = new KvPolicySource(this.nc, {
      namespace: this.#stack.namespace,
      retryMs: 100,
      maxRetryMs: 500,
    });
    this.store = new RedisBucketStore(
      new Redis({ host: this.#redis.host, port: this.#redis.port, enableOfflineQueue: false }),
      // Exact counting under a busy machine: a slow reply is waited for, never counted as a failure here.
      { timeoutMs: 5000 },
    );
    this.#stack.checker.watch(this.instance, this.region, this.holder.lease);
    await this.holder.start();
    this.#running = true;
    this.#loop = this.#decide(usage);
  }

  /** Stop deciding; `graceful` says goodbye to the coordinator, otherwise the agent just vanishes. */
  async stop(graceful: boolean): Promise<void> {
    this.#running = false;
    await this.#loop;
    this.#stack.checker.unwatch(this.instance);
    if (graceful) await this.holder.stop();
    else this.nc.close().catch(() => undefined);
    if (graceful) await this.nc.close();
    await this.policies.close();
    this.store.redis.disconnect();
  }

  async #decide(usage: UsageRecorder): Promise<void> {
    while (this.#running) {
      if (this.rate <= 0) {
        await sleep(20);
        continue;
      }
      const started = Date.now();
      const policy =
        this.#stack.policyName === undefined
          ? undefined
          : this.policies.current().get(this.#stack.policyName);
      const share = policy === undefined ? undefined : this.holder.lease.shareFor(policy.name, 'tenant-1');
      if (policy !== undefined && share !== undefined) {
        const done = this.holder.lease.enter(policy.name);
        const cost = 1;
        try {
          const floor = share.floor;
          const decision = await this.store.decide({
            checks: [
              {
                key: bucketKey(policy.version, `tenant-${this.#seq++ % 1}`, policy.name),
                capacity: policy.capacity * share.share,
                refillPerSecond: policy.refillPerSecond * share.share,
                cost,
                ttlMs: policy.idleTtlSeconds * 1000,
                floor:
                  floor === undefined
                    ? undefined
                    : {
                        beforeMicros: floor.sinceMs * 1000,
                        refillPerSecond: policy.refillPerSecond * floor.share,
                        capacity: policy.capacity * floor.share,
                      },
              },
            ],
          });
          this.decisions++;
          if (decision.allowed) this.#stack.admissions.push({ at: Date.now(), cost, region: this.region });
          const capacity = policy.capacity * share.share;
          usage.record(
            policy.name,
            'tenant-1',
            cost,
            decision.allowed,
            capacity > 0 ? decision.results[0]!.remaining / capacity : 0,
          );
        } catch {
          this.failures++;
        } finally {
          done();
        }
      }
      const wait = 1000 / this.rate - (Date.now() - started);
      await sleep(Math.max(0, wait));
    }
  }
}

export interface StackOptions {
  regions?: string[];
  agentsPerRegion?: number;
  lease?: LeaseSettingsInput;
  rebalance?: RebalanceSettingsInput;
  /** How often the coordinator writes a policy's demand snapshot, ms (default: the engine's). */
  snapshotIntervalMs?: number;
}

export class ProtocolStack implements AsyncDisposable {
  readonly regions: string[];
  readonly checker = new ConservationChecker();
  readonly admissions: Admission[] = [];
  readonly agents: StackAgent[] = [];
  nats!: NatsServer;
  redis = new Map<string, RedisServer>();
  coordinator: RunningCoordinator | undefined;
  namespace = `s${Math.random().toString(36).slice(2, 10)}`;
  policyName: string | undefined;
  readonly #options: StackOptions;
  #pollTimer: NodeJS.Timeout | undefined;
  #instance = 0;

  constructor(options: StackOptions = {}) {
    this.#options = options;
    this.regions = options.regions ?? ['us', 'eu', 'ap'];
  }

  async start(): Promise<this> {
    const b = backend();
    this.nats = await b.startNats({ jetstream: true });
    for (const region of this.regions) this.redis.set(region, await b.startRedis());
    await this.startCoordinator();
    for (const region of this.regions) {
      for (let i = 0; i < (this.#options.agentsPerRegion ?? 2); i++) await this.startAgent(region);
    }
    // Leases lapse with time alone: look often so the checker sees it when it happens.
    this.#pollTimer = setInterval(() => {
      for (const a of this.agents) a.holder.lease.poll();
    }, 20);
    return this;
  }

  async startCoordinator(): Promise<void> {
    const config = {
      ...testConfig({ natsUrl: this.nats.url, regions: this.regions, namespace: this.namespace }),
    };
    this.coordinator = await startCoordinator(config, {
      engine: protocolEngine({
        lease: this.#options.lease ?? FAST_LEASE,
        rebalance: this.#options.rebalance ?? FAST_REBALANCE,
        ...(this.#options.snapshotIntervalMs === undefined
          ? {}
          : { snapshotIntervalMs: this.#options.snapshotIntervalMs }),
      }),
    });
  }

  async killCoordinator(): Promise<void> {
    // No goodbye, no drain: the process is gone. (Its HTTP listener closes; its memory with it.)
    const c = this.coordinator;
    this.coordinator = undefined;
    await c?.stop();
  }

  async startAgent(region: string): Promise<StackAgent> {
    const agent = new StackAgent(this, region, `${region}-${++this.#instance}`, this.redis.get(region)!);
    await agent.start();
    this.agents.push(agent);
    return agent;
  }

  async stopAgent(agent: StackAgent, graceful: boolean): Promise<void> {
    this.agents.splice(this.agents.indexOf(agent), 1);
    await agent.stop(graceful);
  }

  /** Requests per second per region, spread over its agents. */
  setDemand(region: string, perSecond: number): void {
    const agents = this.agents.filter((a) => a.region === region);
    for (const a of agents) a.rate = perSecond / agents.length;
  }

  async admin(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<Response> {
    return fetch(`${this.coordinator!.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json', ...headers },
      body: body === undefined ? null : JSON.stringify(body),
    });
  }

  async createPolicy(name: string, body: Record<string, unknown>): Promise<void> {
    const res = await this.admin('PUT', `/v1/policies/${name}`, body);
    if (res.status >= 300) throw new Error(`PUT policy: ${res.status} ${await res.text()}`);
    this.policyName = name;
  }

  /** Issued default shares of the policy as the coordinator shows them. */
  async shares(): Promise<Record<string, number>> {
    const res = await this.admin('GET', '/v1/allocations');
    const body = (await res.json()) as { policies: { policy: string; shares: Record<string, number> }[] };
    return body.policies.find((p) => p.policy === this.policyName)?.shares ?? {};
  }

  policyAt(agent: StackAgent): Policy | undefined {
    return this.policyName === undefined ? undefined : agent.policies.current().get(this.policyName);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    clearInterval(this.#pollTimer);
    for (const a of [...this.agents]) await a.stop(true).catch(() => undefined);
    await this.coordinator?.stop().catch(() => undefined);
    for (const r of this.redis.values()) await r[Symbol.asyncDispose]();
    await this.nats[Symbol.asyncDispose]();
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Poll `check` until it is true or `timeoutMs` passes; returns the time it took, or throws. */
export function waitFor(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
): Promise<number> {
  return eventually(check, timeoutMs, what, 25);
}

/**
 * The largest admitted(W) / (C + R·W) over every window between two admissions (exact, two pointers per start),
 * each window widened by `slackMs` for the jitter of admission times (taken when the reply arrives, not on
 * Redis time).
 */
export function worstWindowRatio(
  admissions: readonly Admission[],
  capacity: number,
  refillPerSecond: number,
  slackMs: number,
): number {
  const sorted = [...admissions].sort((a, b) => a.at - b.at);
  let worst = 0;
  for (let i = 0; i < sorted.length; i++) {
    let sum = 0;
    for (let j = i; j < sorted.length; j++) {
      sum += sorted[j]!.cost;
      const window = (sorted[j]!.at - sorted[i]!.at + slackMs) / 1000;
      worst = Math.max(worst, sum / (capacity + refillPerSecond * window));
    }
  }
  return worst;
}
