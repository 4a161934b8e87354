/**
 * The agent process: the only place that reads the environment, opens Redis and NATS, and listens.
 *   with the coordinator: QP_REGION=us QP_REDIS_URL=redis://127.0.0.1:6379 QP_NATS_URL=nats://127.0.0.1:4222 \
 *     npx tsx regional-agent/main.ts
 *   standalone: QP_REGION=us QP_REDIS_URL=redis://127.0.0.1:6379 QP_POLICIES_FILE=policies.json \
 *     npx tsx regional-agent/main.ts
 * SIGTERM/SIGINT: not ready at once, then (after QP_DRAIN_DELAY_MS) stop accepting, finish in-flight decisions,
 * say goodbye to the coordinator, close Redis and NATS. SIGHUP: reload the policies file (standalone).
 */
import { readFileSync } from 'node:fs';
import { pino } from 'pino';
import { ConfigError, loadConfig } from './config.js';
import { PolicyFileError } from './policies/file-policy-source.js';
import { startAgent } from './start.js';

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
  const { agent, file } = await startAgent(config, log);

  process.on('SIGHUP', () => {
    if (file === undefined) {
      log.info('SIGHUP ignored: policies come from the coordinator');
      return;
    }
    file.reload().then(
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
}

main().catch((error: unknown) => {
  // A policies file that fails validation is a configuration problem, as a bad QP_* setting is: exit 2
  // (docs/errors.md, AGT_POLICIES_INVALID).
  if (error instanceof PolicyFileError) {
    process.stderr.write(`${error.message}\n`);
    process.exit(2);
  }
  process.stderr.write(`regional agent failed to start: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
