/**
 * The agent process: the only place that reads the environment, opens Redis and listens.
 *   QP_REGION=us QP_REDIS_URL=redis://127.0.0.1:6379 QP_POLICIES_FILE=policies.json npx tsx regional-agent/main.ts
 * SIGTERM/SIGINT: not ready at once, then (after QP_DRAIN_DELAY_MS) stop accepting, finish in-flight decisions,
 * close Redis. SIGHUP: reload the policies file.
 */
import { readFileSync } from 'node:fs';
import { pino } from 'pino';
import { StaticShareView } from '../core/shares.js';
import { buildApp } from './app.js';
import { ConfigError, loadConfig } from './config.js';
import { FilePolicySource } from './policies/file-policy-source.js';
import { connectRedis, whenReady } from './redis/connect.js';
import { RedisDecisionStore } from './redis/decision-store.js';

async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig(process.env, (path) => readFileSync(path, 'utf8'));
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(2);
    }
    throw error;
  }
  const log = pino({ level: config.logLevel, base: { service: 'regional-agent', region: config.region } });
  const redis = connectRedis(config);
  redis.on('error', (error: Error) => log.debug({ err: error }, 'redis connection error'));
  const policies = new FilePolicySource(config.policiesFile!, {
    watch: config.policiesWatch,
    onReloadError: (error) => log.error({ err: error }, 'policies reload failed; the last good set stays'),
  });
  const agent = buildApp(
    {
      store: new RedisDecisionStore(redis),
      policies,
      shares: new StaticShareView({ ...config.staticShares }, config.defaultShare),
      log,
      onClose: async () => {
        await redis.quit().catch(() => redis.disconnect());
      },
    },
    config,
  );

  process.on('SIGHUP', () => {
    policies.reload().then(
      () => log.info('policies reloaded on SIGHUP'),
      (error: unknown) => {
        agent.metrics.policyReloads.labels('failed').inc();
        log.error({ err: error }, 'policies reload failed; the last good set stays');
      },
    );
  });

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'draining');
    agent.drain();
    const force = setTimeout(() => {
      log.error('shutdown timed out; exiting');
      process.exit(1);
    }, config.drainDelayMs + config.shutdownTimeoutMs);
    force.unref();
    setTimeout(() => {
      agent.close().then(
        () => {
          log.info('stopped');
          process.exit(0);
        },
        (error: unknown) => {
          log.error({ err: error }, 'shutdown failed');
          process.exit(1);
        },
      );
    }, config.drainDelayMs);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  await agent.ready;
  if (!(await whenReady(redis, 5000)))
    log.warn('Redis is not reachable yet; failure modes apply until it is');
  const address = await agent.app.listen({ host: config.host, port: config.port });
  log.info({ address, policies: policies.current().size }, 'regional agent listening');
}

main().catch((error: unknown) => {
  process.stderr.write(`regional agent failed to start: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
