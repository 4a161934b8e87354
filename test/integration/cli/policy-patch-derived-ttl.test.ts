/**
 * `quotaplane policy patch` sends the policy back without the fields the budget derives, so they keep following
 * later budget changes. The idle TTL of a policy with classes is derived from its slowest class (and a daily
 * budget's, a sliding log's or a concurrency policy's from its kind), which the CLI did not recognise as derived:
 * the patch pinned it, and the next `budget set` that needs a longer TTL was refused (422) or kept a stale one.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ADMIN_TOKEN,
  admin,
  coordinatorFixture,
  type CoordinatorFixture,
} from '../../helpers/coordinator-fixture.js';
import { cli } from '../../helpers/cli-runner.js';

let f: CoordinatorFixture;
let env: Record<string, string>;

beforeAll(async () => {
  f = await coordinatorFixture();
  const url = await f.app.listen({ host: '127.0.0.1', port: 0 });
  env = { QUOTAPLANE_URL: url, QUOTAPLANE_TOKEN: ADMIN_TOKEN };
});
afterAll(async () => {
  await f?.close();
});

async function put(name: string, body: Record<string, unknown>): Promise<void> {
  const r = await f.app.inject({
    method: 'PUT',
    url: `/v1/policies/${name}`,
    headers: { ...admin, 'content-type': 'application/json' },
    payload: JSON.stringify(body),
  });
  expect(r.statusCode, r.body).toBe(201);
}

describe('quotaplane policy patch', () => {
  it('leaves the idle TTL a class derives unpinned, so a later budget change re-derives it', async () => {
    // Idle TTL max(60, 10/1, 1000/1) = 1000 s, from the gold class.
    await put('tiers', {
      capacity: 10,
      refillPerSecond: 1,
      classes: { gold: { capacity: 1000, refillPerSecond: 1 } },
    });
    const patch = await cli(['policy', 'patch', 'tiers', '--mode', 'local'], { env });
    expect(patch.stderr).toBe('');
    expect(patch.status).toBe(0);
    expect((await f.stores.policies.get('tiers'))!.spec).not.toHaveProperty('idleTtlSeconds');
    const budget = await cli(['budget', 'set', 'tiers', '--capacity', '2000'], { env });
    expect(budget.stderr).toBe('');
    expect(budget.status).toBe(0);
    expect((await f.stores.policies.get('tiers'))!.policy.idleTtlSeconds).toBe(2000);
  });

  it("leaves a daily budget's and a sliding log's derived idle TTL unpinned", async () => {
    await put('per-day', { kind: 'daily', capacity: 100 });
    await put('guesses', { kind: 'sliding_log', capacity: 5, windowSeconds: 600 });
    for (const name of ['per-day', 'guesses']) {
      const patch = await cli(['policy', 'patch', name, '--on-store-failure', 'open'], { env });
      expect(patch.stderr).toBe('');
      expect(patch.status).toBe(0);
      expect((await f.stores.policies.get(name))!.spec, name).not.toHaveProperty('idleTtlSeconds');
    }
  });
});
