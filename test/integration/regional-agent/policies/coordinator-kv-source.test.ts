/**
 * The agents' `KvPolicySource` against the coordinator's bucket on a real NATS: initial load, changes from the
 * admin API within a stated time, deletes, bad entries, a bucket that appears late, and a NATS restart.
 */
import { jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { Registry } from 'prom-client';
import { describe, expect, inject, it } from 'vitest';
import type { Policy } from '../../../../core/policy/policy.js';
import { policyKey } from '../../../../core/wire/kv.js';
import {
  KvPolicySource,
  type KvPolicySourceOptions,
} from '../../../../regional-agent/policies/kv-policy-source.js';
import { backend } from '../../../harness/fixtures.js';
import { tcpProxy } from '../../../helpers/tcp-proxy.js';
import {
  admin,
  coordinatorFixture,
  eventually,
  uniqueNamespace,
  type CoordinatorFixture,
} from '../../../helpers/coordinator-fixture.js';

/** A change made through the admin API must reach a watching source within this time. */
const PROPAGATION_MS = 2000;
const json = { 'content-type': 'application/json' };

async function agentConnection(url: string): Promise<NatsConnection & AsyncDisposable> {
  const nc = await connect({ servers: url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  return Object.assign(nc, {
    async [Symbol.asyncDispose]() {
      if (!nc.isClosed()) await nc.close();
    },
  });
}

function source(nc: NatsConnection, options: KvPolicySourceOptions): KvPolicySource & AsyncDisposable {
  const s = new KvPolicySource(nc, { retryMs: 50, maxRetryMs: 500, ...options });
  return Object.assign(s, { [Symbol.asyncDispose]: () => s.close() });
}

async function put(f: CoordinatorFixture, name: string, body: unknown): Promise<void> {
  const r = await f.app.inject({
    method: 'PUT',
    url: `/v1/policies/${name}`,
    headers: { ...admin, ...json },
    payload: JSON.stringify(body),
  });
  expect(r.statusCode).toBeLessThan(300);
}

const capacityOf = (s: KvPolicySource, name: string): number | undefined => s.current().get(name)?.capacity;

/** Every status event type the connection reports from now on (`disconnect`, `reconnecting`, …). */
function statusSeen(nc: NatsConnection): Set<string> {
  const seen = new Set<string>();
  void (async () => {
    for await (const s of nc.status()) seen.add(s.type);
  })();
  return seen;
}

describe('KvPolicySource', { timeout: 30_000 }, () => {
  it('loads what is there, then follows PUT, budget PATCH and DELETE within the stated time', async () => {
    await using f = await coordinatorFixture();
    const url = f.config.natsServers[0]!;
    await put(f, 'writes', { capacity: 10, refillPerSecond: 2 });
    await put(f, 'a.b-c_d', { capacity: 5, refillPerSecond: 1, mode: 'local' });

    await using nc = await agentConnection(url);
    await using s = source(nc, { namespace: f.config.kvNamespace });
    const seen: ReadonlyMap<string, Policy>[] = [];
    s.onChange((m) => seen.push(m));
    expect(s.current().size).toBe(0);
    await s.ready();
    expect([...s.current().keys()].sort()).toEqual(['a.b-c_d', 'writes']);
    expect(s.current().get('writes')).toEqual({
      name: 'writes',
      kind: 'token_bucket',
      capacity: 10,
      refillPerSecond: 2,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 60,
      version: 1,
    });

    await put(f, 'new', { capacity: 3, refillPerSecond: 3 });
    const created = await eventually(
      () => s.current().has('new'),
      PROPAGATION_MS,
      'a PUT reaches the source',
    );

    const patched = await f.app.inject({
      method: 'PATCH',
      url: '/v1/policies/writes/budget',
      headers: { ...admin, ...json },
      payload: JSON.stringify({ capacity: 40, refillPerSecond: 0.01 }),
    });
    expect(patched.statusCode).toBe(200);
    const budget = await eventually(
      () => capacityOf(s, 'writes') === 40,
      PROPAGATION_MS,
      'a budget PATCH reaches the source',
    );
    // The derived idle TTL follows the budget on the agent too: ceil(40 / 0.01) = 4000 s.
    expect(s.current().get('writes')).toMatchObject({ refillPerSecond: 0.01, idleTtlSeconds: 4000 });

    await f.app.inject({ method: 'DELETE', url: '/v1/policies/a.b-c_d', headers: admin });
    await eventually(() => !s.current().has('a.b-c_d'), PROPAGATION_MS, 'a DELETE reaches the source');
    expect([...s.current().keys()].sort()).toEqual(['new', 'writes']);
    expect(created).toBeLessThan(PROPAGATION_MS);
    expect(budget).toBeLessThan(PROPAGATION_MS);
    // Listeners see the whole set after each change: load, create, budget, delete.
    expect(seen.map((m) => m.size)).toEqual([2, 3, 3, 2]);
  });

  it('is ready at once on an empty bucket', async () => {
    await using f = await coordinatorFixture();
    await using nc = await agentConnection(f.config.natsServers[0]!);
    await using s = source(nc, { namespace: f.config.kvNamespace });
    await s.ready();
    expect(s.current().size).toBe(0);
    expect(s.stats().loads).toBe(1);
  });

  it('counts and skips bad entries, keeping the last good value of a policy', async () => {
    await using f = await coordinatorFixture();
    // This test writes the bad entries itself; the coordinator's guard would put its own back at once.
    await f.stores.guard.close();
    await put(f, 'good', { capacity: 10, refillPerSecond: 1 });
    await put(f, 'victim', { capacity: 7, refillPerSecond: 1 });
    const registry = new Registry();
    await using nc = await agentConnection(f.config.natsServers[0]!);
    await using s = source(nc, { namespace: f.config.kvNamespace, registry });
    await s.ready();

    const kv = f.stores.kv;
    await kv.put(policyKey('victim'), '{not json');
    await kv.put(
      policyKey('victim'),
      JSON.stringify({ name: 'victim', capacity: 5, refillPerSecond: 1, maxCost: 9 }),
    );
    await kv.put(policyKey('victim'), JSON.stringify({ name: 'other', capacity: 5, refillPerSecond: 1 }));
    await kv.put('UPPER', JSON.stringify({ name: 'UPPER', capacity: 5, refillPerSecond: 1 }));
    await kv.put(
      policyKey('fresh'),
      JSON.stringify({ name: 'fresh', capacity: 1, refillPerSecond: 1, extra: true }),
    );
    await eventually(() => s.stats().badEntries === 5, PROPAGATION_MS, 'five bad entries counted');

    expect(capacityOf(s, 'victim')).toBe(7);
    expect(s.current().has('fresh')).toBe(false);
    expect(capacityOf(s, 'good')).toBe(10);
    const text = await registry.metrics();
    expect(text).toContain('qp_agent_policy_source_bad_entries_total{reason="bad_json"} 1');
    expect(text).toContain('qp_agent_policy_source_bad_entries_total{reason="invalid_policy"} 2');
    expect(text).toContain('qp_agent_policy_source_bad_entries_total{reason="name_mismatch"} 1');
    expect(text).toContain('qp_agent_policy_source_bad_entries_total{reason="bad_key"} 1');
    expect(text).toContain('qp_agent_policy_source_policies 2');

    // A fresh source over the same bucket skips them too, and never learns the corrupted policy.
    await using s2 = source(nc, { namespace: f.config.kvNamespace });
    await s2.ready();
    expect([...s2.current().keys()].sort()).toEqual(['good']);
    expect(s2.stats().badEntries).toBe(3);

    // A good write heals it.
    await put(f, 'victim', { capacity: 8, refillPerSecond: 1 });
    await eventually(
      () => capacityOf(s, 'victim') === 8,
      PROPAGATION_MS,
      'a good write replaces a bad entry',
    );
  });

  it('waits for a bucket that does not exist yet, and becomes ready when the coordinator creates it', async () => {
    const namespace = uniqueNamespace();
    await using nc = await agentConnection(inject('nats').url);
    await using s = source(nc, { namespace });
    let ready = false;
    void s.ready().then(() => (ready = true));
    // It tries, fails (no bucket yet), and stays not ready meanwhile.
    await eventually(() => s.stats().failures > 0, 5000, 'a failed attempt to open the missing bucket');
    expect(ready).toBe(false);
    await using f = await coordinatorFixture({ namespace });
    await put(f, 'late', { capacity: 1, refillPerSecond: 1 });
    await s.ready();
    await eventually(() => s.current().has('late'), PROPAGATION_MS, 'the late bucket is watched');
  });

  it('rejects ready() after readyTimeoutMs, and on close before ready', async () => {
    await using f = await coordinatorFixture();
    await using nc = await agentConnection(f.config.natsServers[0]!);
    await using s = source(nc, { namespace: uniqueNamespace(), readyTimeoutMs: 200 });
    await expect(s.ready()).rejects.toThrow(/within 200 ms/);
    const other = source(nc, { namespace: uniqueNamespace() });
    const pending = other.ready();
    await other.close();
    await expect(pending).rejects.toThrow(/closed before it was ready/);
  });

  it('recovers after a NATS restart and sees changes made after it', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    await using f = await coordinatorFixture({ natsUrl: nats.url });
    await put(f, 'p', { capacity: 10, refillPerSecond: 1 });
    await using nc = await agentConnection(nats.url);
    await using s = source(nc, { namespace: f.config.kvNamespace });
    await s.ready();
    expect(capacityOf(s, 'p')).toBe(10);

    const seen = statusSeen(nc);
    await nats.stop();
    // Down for the source's client too (it lost the server and is retrying): what it holds stays.
    await eventually(
      () => seen.has('disconnect') && seen.has('reconnecting'),
      10_000,
      'the client notices NATS is gone and tries to reconnect',
    );
    expect(capacityOf(s, 'p')).toBe(10);
    await nats.start();

    // The coordinator reconnects too; write as soon as it can.
    await eventually(
      async () => {
        const r = await f.app.inject({
          method: 'PATCH',
          url: '/v1/policies/p/budget',
          headers: { ...admin, ...json },
          payload: JSON.stringify({ capacity: 25 }),
        });
        return r.statusCode === 200;
      },
      10_000,
      'the coordinator writes again after the restart',
    );
    await eventually(
      () => capacityOf(s, 'p') === 25,
      10_000,
      'the source sees a change made after the restart',
    );
    await put(f, 'q', { capacity: 2, refillPerSecond: 1 });
    await eventually(() => s.current().has('q'), PROPAGATION_MS, 'and keeps following');
    expect(s.stats().loads).toBeGreaterThanOrEqual(2);
  });

  it('catches up on changes made while it was cut off from NATS, deletes included', async () => {
    await using f = await coordinatorFixture();
    const { host, port } = inject('nats');
    await put(f, 'stays', { capacity: 1, refillPerSecond: 1 });
    await put(f, 'goes', { capacity: 2, refillPerSecond: 1 });
    await put(f, 'changes', { capacity: 3, refillPerSecond: 1 });
    await using proxy = await tcpProxy({ host, port });
    await using nc = await agentConnection(`nats://127.0.0.1:${proxy.port}`);
    await using s = source(nc, { namespace: f.config.kvNamespace });
    await s.ready();
    expect([...s.current().keys()].sort()).toEqual(['changes', 'goes', 'stays']);

    // A second source, not behind the proxy, shows when the changes have reached a connected watcher.
    await using direct = await agentConnection(`nats://${host}:${port}`);
    await using witness = source(direct, { namespace: f.config.kvNamespace });
    await witness.ready();

    await proxy.cut();
    await f.app.inject({ method: 'DELETE', url: '/v1/policies/goes', headers: admin });
    await put(f, 'changes', { capacity: 30, refillPerSecond: 1 });
    await put(f, 'arrives', { capacity: 4, refillPerSecond: 1 });
    await eventually(
      () =>
        [...witness.current().keys()].sort().join() === 'arrives,changes,stays' &&
        capacityOf(witness, 'changes') === 30,
      PROPAGATION_MS,
      'a connected source sees the changes',
    );
    expect([...s.current().keys()].sort()).toEqual(['changes', 'goes', 'stays']);
    expect(capacityOf(s, 'changes')).toBe(3);

    await proxy.restore();
    await eventually(
      () =>
        [...s.current().keys()].sort().join() === 'arrives,changes,stays' && capacityOf(s, 'changes') === 30,
      10_000,
      'the source catches up after the partition heals',
    );
    expect(s.stats().loads).toBe(2);
  });

  it('keeps its last good policies when a reload comes back empty, unless told to accept it', async () => {
    await using f = await coordinatorFixture();
    const { host, port } = inject('nats');
    await put(f, 'a', { capacity: 1, refillPerSecond: 1 });
    await put(f, 'b', { capacity: 2, refillPerSecond: 1 });
    await using proxy = await tcpProxy({ host, port });
    await using nc = await agentConnection(`nats://127.0.0.1:${proxy.port}`);
    await using kept = source(nc, { namespace: f.config.kvNamespace });
    await using accepting = source(nc, { namespace: f.config.kvNamespace, acceptEmptyReload: true });
    await kept.ready();
    await accepting.ready();
    expect(kept.current().size).toBe(2);

    // The bucket is lost and created again, empty (no policy, no deletion marker), while the agent is cut off.
    await proxy.cut();
    const bucket = `KV_${f.config.kvNamespace}-policies`;
    const jsm = await jetstreamManager(f.nc);
    const config = (await jsm.streams.info(bucket)).config;
    await jsm.streams.delete(bucket);
    await jsm.streams.add({ ...config });
    await proxy.restore();
    await eventually(
      () => accepting.current().size === 0,
      10_000,
      'the accepting source applies the empty reload',
    );
    await eventually(() => kept.stats().loads === 2, 10_000, 'the keeping source reloads');
    expect([...kept.current().keys()].sort()).toEqual(['a', 'b']);
    expect(kept.stats().emptyReloadsKept).toBe(1);
    expect(accepting.stats().emptyReloadsKept).toBe(0);
  });

  it('still drops every policy an operator deleted while it was cut off', async () => {
    await using f = await coordinatorFixture();
    const { host, port } = inject('nats');
    await put(f, 'a', { capacity: 1, refillPerSecond: 1 });
    await put(f, 'b', { capacity: 2, refillPerSecond: 1 });
    await using proxy = await tcpProxy({ host, port });
    await using nc = await agentConnection(`nats://127.0.0.1:${proxy.port}`);
    await using s = source(nc, { namespace: f.config.kvNamespace });
    await s.ready();
    await proxy.cut();
    for (const name of ['a', 'b']) {
      const r = await f.app.inject({ method: 'DELETE', url: `/v1/policies/${name}`, headers: admin });
      expect(r.statusCode).toBe(204);
    }
    await proxy.restore();
    await eventually(() => s.current().size === 0, 10_000, 'the deletions reach the source');
    expect(s.stats().loads).toBe(2);
    expect(s.stats().emptyReloadsKept).toBe(0);
  });
});
