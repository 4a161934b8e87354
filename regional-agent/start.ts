/**
 * Start an agent from its configuration: open Redis (and NATS when `natsUrl` is set), build the app, listen.
 * Used by `main.ts` and by tests that run whole agents in one process.
 */
import { farthestRoundTrip, linkAllowanceMs, roundTripOf } from '../core/distance.js';
import type { FastifyPluginAsync } from 'fastify';
import type { Cluster, Redis } from 'ioredis';
import type { Logger } from 'pino';
import { StaticShareView } from '../core/shares/shares.js';
import { buildApp, type AgentApp } from './app.js';
import type { AgentConfig } from './config.js';
import { agentInstance, connectCoordination, type Coordination } from './coordination.js';
import { listenRls } from './grpc/rls-server.js';
import { AgentMetrics } from './observability/metrics.js';
import { FilePolicySource } from './policies/file-policy-source.js';
import { connectRedis, whenReady } from './redis/connect.js';
import { RedisDecisionStore } from './redis/decision-store.js';
import { ackReplicas } from './redis/scripts.js';
import { RedisClock } from './redis/redis-clock.js';
import { RedisTransferStore } from './redis/transfer-store.js';
import { RedisTermsUntil } from './redis/terms-until-store.js';
import { TermsUntil } from './terms/terms-until.js';
import { BorrowPlanner } from '../core/borrowing/planner.js';
import { systemClock } from '../core/clock.js';
import { borrowMetrics, type BorrowMetrics } from './borrowing/borrow-metrics.js';
import { Borrower } from './borrowing/borrower.js';
import { borrowReserveMs } from '../core/borrowing/borrow.js';
import { natsLoanAsker } from './borrowing/nats-loan-client.js';
import { warmUp } from './startup/warm-up.js';

export interface RunningAgent {
  agent: AgentApp;
  /** `http://host:port` */
  url: string;
  /** `grpc://host:port` of the rate-limit service, when `grpcPort` is set. */
  grpcUrl: string | undefined;
  /** The policies file source (standalone mode), for SIGHUP reloads. */
  file: FilePolicySource | undefined;
  coordination: Coordination | undefined;
}

export async function startAgent(config: Readonly<AgentConfig>, log: Logger): Promise<RunningAgent> {
  const redis = connectRedis(config);
  if (config.redisWaitReplicas > 0) {
    ackReplicas(redis, { replicas: config.redisWaitReplicas, timeoutMs: config.redisWaitTimeoutMs });
  }
  const redisClock = new RedisClock(redis);
  redis.on('error', (error: Error) => log.debug({ err: error }, 'redis connection error'));
  const metrics = new AgentMetrics({ region: config.region });
  // Until the Redis clock has a sample, store calls carry no deadline into the script (a late call could still
  // charge): no traffic until then. With a coordinator, not before the policies and a lease arrive either.
  const othersNotReady = (): string[] => [
    ...(redisClock.synced ? [] : ['no Redis TIME sample yet (store calls would carry no deadline)']),
    ...(coordination?.notReady() ?? []),
  ];
  let warmed = config.warmUpRounds === 0;
  let closed = false;
  // Each term's end, recorded before it is answered; read at start by an agent with a coordinator.
  const termsUntilStore = new RedisTermsUntil(redis, {
    instance: agentInstance(config),
    timeoutMs: config.storeTimeoutMs,
  });
  const coordination =
    config.natsUrl === undefined
      ? undefined
      : await connectCoordination(config, log, metrics, termsUntilStore);
  const file =
    coordination === undefined
      ? new FilePolicySource(config.policiesFile!, {
          watch: config.policiesWatch,
          onReloadError: (error) =>
            log.error({ err: error }, 'policies reload failed; the last good set stays'),
        })
      : undefined;
  const policies = coordination?.policies ?? file!;
  // Borrowing needs the other regions: only with a coordinator (its allocation records name them).
  const borrowing =
    config.borrowing && coordination !== undefined
      ? borrowingParts(
          config,
          coordination,
          new RedisTransferStore(redis, { timeoutMs: config.storeTimeoutMs, clock: redisClock }),
          metrics,
        )
      : undefined;
  const agent = buildApp(
    {
      store: new RedisDecisionStore(redis, {
        timeoutMs: config.storeTimeoutMs,
        clock: redisClock,
        batch: config.storeBatching === 'batch',
        idempotencyMaxRecords: config.idempotencyMaxRecords,
      }),
      policies,
      shares: coordination?.shares ?? new StaticShareView({ ...config.staticShares }, config.defaultShare),
      log,
      metrics,
      redisClock,
      termsUntil: new TermsUntil(termsUntilStore),
      ...(coordination === undefined ? {} : { restartHold: coordination.restartHold }),
      notReady: () => [
        ...othersNotReady(),
        ...(warmed ? [] : ['warming up (dry-run decisions through the decision path)']),
      ],
      ...(coordination === undefined ? {} : { forwarder: coordination.forwarder, usage: coordination.usage }),
      ...(borrowing === undefined ? {} : { shortfall: borrowing.shortfall }),
      // Closed after every part that uses them: NATS (policies, leases, strict, loans) first, then Redis.
      resources: [
        redisPlugin(redis, redisClock, () => (closed = true)),
        ...(coordination === undefined ? [] : [coordinationPlugin(coordination)]),
      ],
    },
    config,
  );
  coordination?.serveStrict(agent.service, agent.admission);
  coordination?.holder.reportShedFrom(agent.admission);
  if (borrowing !== undefined)
    coordination?.serveLoans(borrowing.transfers, agent.admission, borrowing.metrics);
  // Standalone, the policies file is read at once; with a coordinator the agent listens (not ready) until its
  // policies and lease arrive.
  if (file !== undefined) await agent.ready;
  if (!(await whenReady(redis, 5000)))
    log.warn('Redis is not reachable yet; failure modes apply until it is');
  // The warm-up runs once every other reason not to be ready is gone (its dry runs then take the path real
  // decisions take); the agent says ready only after it. Standalone, it runs before the agent listens, unless
  // Redis is still away: then the agent listens (not ready) and warms up once Redis answers.
  const warming = warmed ? Promise.resolve() : warmWhenServing();
  if (file !== undefined) await Promise.race([warming, new Promise((r) => setTimeout(r, 5000).unref())]);
  if (config.hmacSecret === undefined) {
    log.warn(
      'QP_HMAC_SECRET is not set: subjects reach Redis keys and usage reports as given; set the same secret on every agent (docs/security.md)',
    );
  }
  const url = await agent.app.listen({ host: config.host, port: config.port });
  let grpcUrl: string | undefined;
  if (config.grpcPort !== undefined) {
    const rls = await listenRls(agent.rls, config.grpcHost ?? config.host, config.grpcPort);
    agent.attach(rls);
    grpcUrl = rls.url;
  }
  log.info(
    { address: url, grpc: grpcUrl, coordinator: coordination !== undefined },
    'regional agent listening',
  );
  return { agent, url, grpcUrl, file, coordination };

  async function warmWhenServing(): Promise<void> {
    try {
      await agent.ready;
      while (othersNotReady().length > 0) {
        if (closed) return;
        await new Promise((r) => setTimeout(r, 25).unref());
      }
      warnOfFarRedis(redisClock.linkRoundTripUs, config.storeTimeoutMs, log);
      const report = await warmUp(agent.app, policies.current(), {
        region: config.region,
        rounds: config.warmUpRounds,
        // A batch's decisions are admitted one by one: never more than the agent lets in flight.
        batch: Math.min(64, config.maxInFlight),
      });
      metrics.warmUpSeconds.set(report.ms / 1000);
      log.info(report, 'warmed up: dry-run decisions through the decision path');
    } catch (error) {
      log.warn({ err: error }, 'warm-up failed; the agent serves without it');
    } finally {
      warmed = true;
    }
  }
}

/**
 * Say so when Redis is far for the store timeout: a call's reply must come within `storeTimeoutMs` of its write,
 * and a round trip over a third of it leaves too little for Redis's own queue and a busy moment, so decisions fail
 * as their policies declare (`store_unavailable`) under load though Redis is healthy.
 */
export function warnOfFarRedis(roundTripUs: number | undefined, storeTimeoutMs: number, log: Logger): void {
  if (roundTripUs === undefined || roundTripUs * 3 <= storeTimeoutMs * 1000) return;
  const roundTripMs = Math.round(roundTripUs / 100) / 10;
  log.warn(
    { redisRoundTripMs: roundTripMs, storeTimeoutMs },
    `Redis answers in ${roundTripMs} ms, more than a third of QP_STORE_TIMEOUT_MS (${storeTimeoutMs}): decisions will fail as their policies declare when it is busy; raise QP_STORE_TIMEOUT_MS to at least ${Math.ceil(roundTripMs * 3)} or run Redis nearer (docs/running.md)`,
  );
}

/** Owns the Redis connection and its clock: closed after everything that calls Redis. */
function redisPlugin(redis: Redis | Cluster, clock: RedisClock, onClose: () => void): FastifyPluginAsync {
  return (scope) => {
    scope.addHook('onClose', async () => {
      onClose();
      clock.close();
      await redis.quit().catch(() => redis.disconnect());
    });
    return Promise.resolve();
  };
}

/** Owns the link to the coordinator: leaves the strict and loan queue groups, says goodbye, drains NATS. */
function coordinationPlugin(coordination: Coordination): FastifyPluginAsync {
  return (scope) => {
    scope.addHook('onClose', () => coordination.close());
    return Promise.resolve();
  };
}

/** Borrowing's parts: the planner and its metrics, the borrower (a refusal's shortfall handler), the transfers. */
function borrowingParts(
  config: Readonly<AgentConfig>,
  coordination: Coordination,
  transfers: RedisTransferStore,
  metrics: AgentMetrics,
): { shortfall: Borrower; transfers: RedisTransferStore; metrics: BorrowMetrics } {
  const planner = new BorrowPlanner({
    maxLenders: config.borrowMaxLenders,
    maxEntries: config.borrowMemory,
    unreachableBackoffMs: config.borrowBackoffMs,
  });
  const loanMetrics = borrowMetrics(metrics.registry, planner);
  const farthest = linkAllowanceMs(farthestRoundTrip(config.roundTrips, config.region));
  const shortfall = new Borrower({
    region: config.region,
    planner,
    shares: coordination.shares,
    store: transfers,
    ask: natsLoanAsker(coordination.nc, config.kvNamespace),
    clock: systemClock,
    reserveMs: borrowReserveMs(config.storeTimeoutMs),
    lowWater: config.borrowLowWater,
    // Off the request path, a top-up may wait for the farthest lender's round trip too, so a loan from across
    // the widest link still arrives (docs/protocol.md, "Timings at a distance").
    topUpMs: config.decisionDeadlineMs + farthest,
    // A refusal's borrow may wait as long beyond the decision's deadline as a forwarded strict check does.
    linkAllowanceMs: farthest,
    roundTripMs: (lender) => roundTripOf(config.roundTrips, config.region, lender) ?? 0,
    metrics: loanMetrics,
    imported: (policy, tokens) => coordination.usage.imported(policy, tokens),
  });
  return { shortfall, transfers, metrics: loanMetrics };
}
