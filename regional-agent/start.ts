/**
 * Start an agent from its configuration: open Redis (and NATS when `natsUrl` is set), build the app, listen.
 * Used by `main.ts` and by tests that run whole agents in one process.
 */
import type { Logger } from 'pino';
import { StaticShareView } from '../core/shares.js';
import { buildApp, type AgentApp } from './app.js';
import type { AgentConfig } from './config.js';
import { connectCoordination, type Coordination } from './coordination.js';
import { AgentMetrics } from './observability/metrics.js';
import { FilePolicySource } from './policies/file-policy-source.js';
import { connectRedis, whenReady } from './redis/connect.js';
import { RedisDecisionStore } from './redis/decision-store.js';

export interface RunningAgent {
  agent: AgentApp;
  /** `http://host:port` */
  url: string;
  /** The policies file source (standalone mode), for SIGHUP reloads. */
  file: FilePolicySource | undefined;
  coordination: Coordination | undefined;
}

export async function startAgent(config: Readonly<AgentConfig>, log: Logger): Promise<RunningAgent> {
  const redis = connectRedis(config);
  redis.on('error', (error: Error) => log.debug({ err: error }, 'redis connection error'));
  const metrics = new AgentMetrics({ region: config.region });
  const coordination =
    config.natsUrl === undefined ? undefined : await connectCoordination(config, log, metrics);
  const file =
    coordination === undefined
      ? new FilePolicySource(config.policiesFile!, {
          watch: config.policiesWatch,
          onReloadError: (error) =>
            log.error({ err: error }, 'policies reload failed; the last good set stays'),
        })
      : undefined;
  const policies = coordination?.policies ?? file!;
  const agent = buildApp(
    {
      store: new RedisDecisionStore(redis),
      policies,
      shares: coordination?.shares ?? new StaticShareView({ ...config.staticShares }, config.defaultShare),
      log,
      metrics,
      ...(coordination === undefined
        ? {}
        : {
            forwarder: coordination.forwarder,
            usage: coordination.usage,
            notReady: () => coordination.notReady(),
          }),
      onClose: async () => {
        await coordination?.close();
        await redis.quit().catch(() => redis.disconnect());
      },
    },
    config,
  );
  coordination?.serveStrict(agent.service);
  // Standalone, the policies file is read at once; with a coordinator the agent listens (not ready) until its
  // policies and lease arrive.
  if (file !== undefined) await agent.ready;
  if (!(await whenReady(redis, 5000)))
    log.warn('Redis is not reachable yet; failure modes apply until it is');
  const url = await agent.app.listen({ host: config.host, port: config.port });
  log.info({ address: url, coordinator: coordination !== undefined }, 'regional agent listening');
  return { agent, url, file, coordination };
}
