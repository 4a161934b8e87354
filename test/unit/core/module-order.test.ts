/**
 * core/ has no import cycle (eslint's import-x/no-cycle), so a module's constants are set before any other module
 * reads them, whichever is imported first. A cycle once made the token-bucket wire's cost bound `1 / MICRO` NaN
 * when core/models/token-bucket.ts was imported before core/wire/bucket.ts (the agent's order), which refused every
 * decision as a bad request; this pins that order.
 */
import { describe, expect, it, vi } from 'vitest';

describe('core modules in any import order', () => {
  it('the token-bucket wire validates a request when core/models/token-bucket.ts is imported first', async () => {
    vi.resetModules();
    await import('../../../core/models/token-bucket.js');
    const { encodeRequest } = await import('../../../core/wire/bucket.js');
    const encoded = encodeRequest({
      checks: [{ key: 'rl:v1:{t}:p', capacity: 10, refillPerSecond: 1, cost: 1, ttlMs: 60_000 }],
    });
    expect(encoded.checks[0]!.cost).toBe(1_000_000);
  });
});
