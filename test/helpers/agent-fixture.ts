/**
 * An agent on a real Redis, the way integration tests build one: a client with the decision path's options, a
 * RedisDecisionStore, static policies and shares, a silent log, `buildApp`, ready (and listening, if asked).
 * Every part can be replaced; `await using` (or `[Symbol.asyncDispose]()` in an `afterAll`) tears it down in
 * order: the agent (listeners, in-flight requests, store), the Redis clock, the client, then a Redis server the
 * fixture started itself. What the test passed in (a server, a client) is left running.
 */
import type { FastifyInstance } from 'fastify';
import type { Cluster, Redis } from 'ioredis';
import { inject } from 'vitest';
import { pino } from 'pino';
import type { Policy } from '../../core/policy/policy.js';
import { StaticShareView, type ShareView } from '../../core/shares/shares.js';
import { buildApp, type AgentApp, type AgentDeps } from '../../regional-agent/app.js';
import { AgentConfig } from '../../regional-agent/config.js';
import type { DecisionStore } from '../../regional-agent/decisions/decision-store.js';
import { listenRls, type RlsListener } from '../../regional-agent/grpc/rls-server.js';
import type { AgentMetrics } from '../../regional-agent/observability/metrics.js';
import type { PolicySource } from '../../regional-agent/policies/policy-source.js';
import { StaticPolicySource } from '../../regional-agent/policies/static-policy-source.js';
import { connectRedis, whenReady, type RedisTarget } from '../../regional-agent/redis/connect.js';
import { RedisDecisionStore } from '../../regional-agent/redis/decision-store.js';
import { RedisClock } from '../../regional-agent/redis/redis-clock.js';
import { RedisTermsUntil } from '../../regional-agent/redis/terms-until-store.js';
import { agentInstance } from '../../regional-agent/coordination.js';
import { TermsUntil } from '../../regional-agent/terms/terms-until.js';
import type { RedisServer } from '../harness/backend.js';
import { backend } from '../harness/fixtures.js';

/**
 * Which Redis: the suite's shared one (`shared`, the default) or its 3-master cluster (`cluster`); a server of
 * the agent's own (`own`: started, and stopped on dispose, for tests that count commands or break the server);
 * a server or target (e.g. Sentinel) the test manages; or a client another agent already uses.
 */
export type AgentRedis =
  | 'shared'
  | 'cluster'
  | 'own'
  | { readonly server: RedisServer }
  | { readonly target: RedisTarget }
  | { readonly client: Redis | Cluster };

export interface AgentFixtureOptions {
  readonly policies: readonly Policy[] | PolicySource;
  /** Shares per policy (a StaticShareView), or a view; by default every policy's whole capacity. */
  readonly shares?: Readonly<Record<string, number>> | ShareView;
  readonly redis?: AgentRedis;
  /**
   * Fields of AgentConfig over the fixture's: region `us`, where Redis is, and 2000 ms for the decision
   * deadline and the store timeout (tests count decisions; those that time them set their own). The store's
   * timeout is `storeTimeoutMs`.
   */
  readonly config?: Readonly<Record<string, unknown>>;
  /**
   * A Redis clock for the store (deadlines carried into the scripts) and the app (direct-decision terms' deadlines,
   * as start.ts passes it), sampled every `sampleEveryMs`; with it, terms are recorded on this Redis under the
   * config's instance (start.ts's RedisTermsUntil).
   */
  readonly clock?: { readonly sampleEveryMs: number };
  /** Wrap the store (e.g. to count its calls). */
  readonly store?: (store: RedisDecisionStore) => DecisionStore;
  /** More of the agent's parts (random, forwarder, onClose...). */
  readonly deps?: Partial<Omit<AgentDeps, 'store' | 'policies' | 'shares'>>;
  /** Listen on a free loopback port (`url`); otherwise tests use `app.inject`. */
  readonly listen?: boolean;
  /** Serve Envoy's rate-limit service over gRPC on a free loopback port too (`rlsListener`). */
  readonly rls?: boolean;
}

export interface AgentFixture extends AsyncDisposable {
  readonly agent: AgentApp;
  readonly app: FastifyInstance;
  readonly metrics: AgentMetrics;
  readonly config: AgentConfig;
  /** The agent's HTTP address; throws unless it was asked to listen. */
  readonly url: string;
  /** The gRPC rate-limit listener (`agent.rls` is the service behind it); throws unless it was asked for. */
  readonly rlsListener: RlsListener;
  readonly redis: Redis | Cluster;
  /** The Redis server, when the fixture started it or was given it. */
  readonly server: RedisServer | undefined;
  /** The Redis store (inside the `store` option's wrapper, when one was given). */
  readonly store: RedisDecisionStore;
  readonly clock: RedisClock | undefined;
  /** The first number of `/metrics` matching `pattern`'s group, 0 when absent. */
  metric(pattern: RegExp): Promise<number>;
}

function isShareView(shares: AgentFixtureOptions['shares']): shares is ShareView {
  return typeof (shares as Partial<ShareView>).shareFor === 'function';
}

function where(choice: AgentRedis, own: RedisServer | undefined): RedisTarget | undefined {
  if (choice === 'shared') return { redisUrl: inject('redis').url };
  if (choice === 'cluster')
    return { redisClusterNodes: inject('redisCluster').map((n) => `${n.host}:${n.port}`) };
  if (choice === 'own') return { redisUrl: own!.url };
  if ('server' in choice) return { redisUrl: choice.server.url };
  if ('target' in choice) return choice.target;
  return undefined;
}

/**
 * The agent on a client the caller connected and closes (not ready yet: await `agent.ready`), for helpers that
 * build agents synchronously; `agentFixture` is the same agent with its Redis and teardown.
 */
export function agentOn(
  redis: Redis | Cluster,
  options: Omit<AgentFixtureOptions, 'redis' | 'clock' | 'listen' | 'rls'>,
  target?: RedisTarget,
  clock?: RedisClock,
): { agent: AgentApp; config: AgentConfig; store: RedisDecisionStore } {
  const config = AgentConfig.parse({
    region: 'us',
    // Where Redis is, unless the test says (one of the three, as the schema requires).
    ...(['redisUrl', 'redisClusterNodes', 'redisSentinels'].some((k) => options.config?.[k] !== undefined)
      ? {}
      : (target ?? { redisUrl: 'redis://unused' })),
    policiesFile: 'unused',
    decisionDeadlineMs: 2000,
    storeTimeoutMs: 2000,
    ...options.config,
  });
  const store = new RedisDecisionStore(redis, {
    timeoutMs: config.storeTimeoutMs,
    ...(clock === undefined ? {} : { clock }),
  });
  const policies = options.policies;
  const shares = options.shares ?? new StaticShareView();
  const agent = buildApp(
    {
      log: pino({ level: 'silent' }),
      ...(clock === undefined
        ? {}
        : {
            redisClock: clock,
            termsUntil: new TermsUntil(
              new RedisTermsUntil(redis, {
                instance: agentInstance(config),
                timeoutMs: config.storeTimeoutMs,
              }),
            ),
          }),
      ...options.deps,
      store: options.store === undefined ? store : options.store(store),
      policies: 'length' in policies ? new StaticPolicySource([...policies]) : policies,
      shares: isShareView(shares) ? shares : new StaticShareView({ ...shares }),
    },
    config,
  );
  return { agent, config, store };
}

/**
 * An agent on a real Redis (or cluster) with static policies and shares, generous timeouts (these tests count
 * decisions, they do not time them) and the reservation sweep off unless asked for. Await `ready` before use.
 */
export function agentOnRedis(
  redis: Redis | Cluster,
  policies: readonly Policy[],
  options: { shares?: ShareView; region?: string; sweepMs?: number; random?: () => number } = {},
): AgentApp {
  return agentOn(redis, {
    policies,
    ...(options.shares === undefined ? {} : { shares: options.shares }),
    ...(options.random === undefined ? {} : { deps: { random: options.random } }),
    config: { region: options.region ?? 'us', reservationSweepMs: options.sweepMs ?? 0 },
  }).agent;
}

/** Build the agent, wait until it is ready; on a failure, undo what was started and rethrow. */
export async function agentFixture(options: AgentFixtureOptions): Promise<AgentFixture> {
  const choice = options.redis ?? 'shared';
  const undo: (() => PromiseLike<void> | void)[] = [];
  const teardown = async () => {
    for (const step of undo.splice(0).reverse()) await step();
  };
  try {
    let server: RedisServer | undefined;
    if (choice === 'own') {
      const own = await backend().startRedis();
      undo.push(() => own[Symbol.asyncDispose]());
      server = own;
    } else if (typeof choice === 'object' && 'server' in choice) server = choice.server;
    const target = where(choice, server);
    let redis: Redis | Cluster;
    if (target === undefined) redis = (choice as { client: Redis | Cluster }).client;
    else {
      const client = connectRedis(target);
      client.on('error', () => undefined);
      undo.push(() => client.disconnect());
      if (!(await whenReady(client, 10_000)))
        throw new Error(`Redis not ready within 10 s: ${JSON.stringify(target)}`);
      redis = client;
    }
    let clock: RedisClock | undefined;
    if (options.clock !== undefined) {
      const started = new RedisClock(redis, { sampleEveryMs: options.clock.sampleEveryMs });
      undo.push(() => started.close());
      await started.sample();
      clock = started;
    }
    const { agent, config, store } = agentOn(redis, options, target, clock);
    undo.push(() => agent.close());
    await agent.ready;
    const url = options.listen === true ? await agent.app.listen({ host: '127.0.0.1', port: 0 }) : undefined;
    let rls: RlsListener | undefined;
    if (options.rls === true) {
      rls = await listenRls(agent.rls, '127.0.0.1', 0);
      agent.attach(rls);
    }
    return {
      agent,
      app: agent.app,
      metrics: agent.metrics,
      config,
      get url(): string {
        if (url === undefined) throw new Error('the agent was not asked to listen');
        return url;
      },
      get rlsListener(): RlsListener {
        if (rls === undefined) throw new Error('the agent was not asked to serve the rate-limit service');
        return rls;
      },
      redis,
      server,
      store,
      clock,
      async metric(pattern) {
        const match = pattern.exec((await agent.app.inject({ method: 'GET', url: '/metrics' })).body);
        return match === null ? 0 : Number(match[1]);
      },
      [Symbol.asyncDispose]: teardown,
    };
  } catch (error) {
    await teardown();
    throw error;
  }
}
