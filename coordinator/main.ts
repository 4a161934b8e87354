/**
 * The coordinator process: read the environment (QP_*), start, and shut down gracefully on SIGTERM or SIGINT.
 * Exit codes: 0 after a clean shutdown, 2 for a bad configuration, 1 for anything else.
 */
import { readFileSync } from 'node:fs';
import { ConfigError, loadConfig } from './config.js';
import { protocolEngine } from './protocol/protocol-engine.js';
import { startCoordinator } from './server.js';

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
  const running = await startCoordinator(config, {
    engine: protocolEngine(config.protocol),
    // A coordinator that lost the leader lease has stopped acting; exit so the supervisor starts it again as a
    // standby (it then waits for the lease like any other).
    onLeadershipLost: (reason) => {
      process.stderr.write(`coordinator lost the leader lease (${reason}); exiting\n`);
      void running.stop().finally(() => process.exit(1));
    },
  });
  running.app.log.info({ url: running.url, regions: config.regions }, 'coordinator listening');
  const shutdown = (signal: string): void => {
    running.app.log.info({ signal }, 'shutting down');
    running.stop().then(
      () => process.exit(0),
      (error: unknown) => {
        running.app.log.error({ err: error }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', shutdown);
  process.once('SIGINT', shutdown);
}

main().catch((error: unknown) => {
  process.stderr.write(
    `coordinator failed to start: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
