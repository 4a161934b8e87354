import type { ServerBackend } from './backend.js';
import { containerBackend } from './container-backend.js';
import { processBackend } from './process-backend.js';

/**
 * The backend tests use: `QP_TEST_BACKEND=process` (default) runs servers from PATH; `containers` runs them
 * in containers with testcontainers (container-backend.ts: Docker, host networking, REDIS_IMAGE / NATS_IMAGE).
 */
export function selectBackend(): ServerBackend {
  const name = process.env['QP_TEST_BACKEND'] ?? 'process';
  switch (name) {
    case 'process':
      return processBackend;
    case 'containers':
      return containerBackend;
    default:
      throw new Error(`unknown QP_TEST_BACKEND "${name}" (known: process, containers)`);
  }
}
