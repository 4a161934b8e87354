/**
 * A DELETE that the bucket applied is a delete, whatever happens after: the store used to read the deletion marker
 * back (for its revision) with a call of its own, and when that read failed (a NATS hiccup, the 2 s deadline
 * under load) the request answered 503 COORD_ERR_STORE_UNAVAILABLE having deleted the policy, wrote no audit
 * record and told no listener, so the protocol engine went on allocating a policy that no longer exists, the
 * policy gauge stayed one too high, and the operator's retry got a 404.
 */
import { jetstream } from '@nats-io/jetstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../../../core/clock.js';
import { KvPolicyStore } from '../../../../coordinator/policies/kv-policy-store.js';
import type { PolicyChange } from '../../../../coordinator/policies/policy-store.js';
import { silentLogger } from '../../../../coordinator/ports.js';
import { coordinatorFixture, type CoordinatorFixture } from '../../../helpers/coordinator-fixture.js';

let f: CoordinatorFixture;
beforeAll(async () => {
  f = await coordinatorFixture();
});
afterAll(async () => {
  await f?.close();
});

describe('a delete whose marker cannot be read back', () => {
  it('is answered as done, audited and announced', async () => {
    // This test's store writes the bucket beside the fixture's, whose guard would undo its writes as foreign.
    await f.stores.guard.close();
    let failGets = false;
    // The bucket as the store sees it: every get after the delete fails, as a timed-out request would.
    const kv = new Proxy(f.stores.kv, {
      get(target, prop, receiver) {
        const value = Reflect.get(target, prop, receiver) as unknown;
        if (prop === 'get')
          return (...args: unknown[]) =>
            failGets
              ? Promise.reject(new Error('TIMEOUT'))
              : (target.get as (...a: unknown[]) => unknown).apply(target, args);
        if (prop === 'delete')
          return async (...args: unknown[]) => {
            await (target.delete as (...a: unknown[]) => Promise<void>).apply(target, args);
            failGets = true;
          };
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
    const store = new KvPolicyStore({
      kv,
      js: jetstream(f.nc),
      bucket: f.stores.names.policies,
      audit: f.stores.audit,
      regions: ['us', 'eu', 'ap'],
      maxPolicies: 100,
      clock: systemClock,
      metrics: f.metrics,
      log: silentLogger,
    });
    await store.init();
    const ctx = { actor: { role: 'write' as const, name: 'admin' }, requestId: 'del-1' };
    await store.put('doomed', { capacity: 5, refillPerSecond: 1 } as never, ctx);
    const changes: PolicyChange[] = [];
    store.onChange((c) => changes.push(c));

    await expect(store.delete('doomed', ctx)).resolves.toMatchObject({
      before: { spec: { name: 'doomed' } },
    });
    failGets = false;
    expect(await store.get('doomed')).toBeUndefined();
    expect(changes.map((c) => c.kind)).toEqual(['delete']);
    const trail = await f.stores.audit.read({ policy: 'doomed', limit: 10 });
    expect(trail.entries.map((e) => e.action)).toEqual(['delete', 'create']);
  });
});
