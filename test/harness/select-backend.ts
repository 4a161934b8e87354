import type { ServerBackend } from './backend.js';
import { processBackend } from './process-backend.js';

/**
 * The backend tests use: `QP_TEST_BACKEND=process` (default) runs servers from PATH. Other backends register
 * here when they exist.
 */
export function selectBackend(): ServerBackend {
  const name = process.env['QP_TEST_BACKEND'] ?? 'process';
  switch (name) {
    case 'process':
      return processBackend;
    default:
      throw new Error(`unknown QP_TEST_BACKEND "${name}" (known: process)`);
  }
}
