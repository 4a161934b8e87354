/**
 * A reservation during a store outage, for a policy that fails `local` (an in-process emergency bucket decides
 * while Redis cannot): the reserve cannot be recorded, so it must not spend the subject's emergency bucket either.
 * Nothing could give those tokens back (a settlement refunds the store only), each retry would spend them again,
 * and the subject's ordinary requests depend on that bucket for as long as the outage lasts. Redis is frozen
 * (SIGSTOP) for the outage.
 */
import { describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

// Emergency bucket: 10 % of 100, at least maxCost (10): 10 tokens, refilling at 1e-5/s (nothing comes back).
const policies = [
  parsePolicy({ name: 'local', capacity: 100, refillPerSecond: 1e-4, maxCost: 10, onStoreFailure: 'local' }),
];

async function post(f: AgentFixture, url: string, payload: object) {
  const res = await f.app.inject({ method: 'POST', url, payload });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

describe('a reservation refused for a store outage spends no emergency tokens', () => {
  it('three reserves of 10 are refused; the subject still has its 10 emergency tokens for its requests', async () => {
    await using f = await agentFixture({
      policies,
      redis: 'own',
      config: { reservationSweepMs: 0, storeTimeoutMs: 100 },
    });
    const subject = uniquePrefix('outage');
    await f.server!.pause();
    try {
      for (let i = 0; i < 3; i++) {
        const r = await post(f, '/v1/reservations', { policy: 'local', subject, amount: 10 });
        expect(r.status === 503 || r.body['allowed'] === false, JSON.stringify(r.body)).toBe(true);
        expect(r.body['reservation']).toBeUndefined();
      }
      const d = await post(f, '/v1/decisions', { policy: 'local', subject, cost: 10 });
      expect(d.body).toMatchObject({
        allowed: true,
        results: [{ reason: 'emergency_bucket', limit: 10, remaining: 0 }],
      });
    } finally {
      await f.server!.resume();
    }
  });
});
