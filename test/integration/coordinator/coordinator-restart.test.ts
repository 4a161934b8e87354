/**
 * The coordinator across restarts and outages, with real servers: policies and the audit trail survive a new
 * coordinator on the same NATS and a NATS restart; while NATS is down the API says so (503) and writes nothing;
 * shutdown turns not-ready, finishes the request in flight and drains NATS.
 */
import { once } from 'node:events';
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import type { AuditResponse } from '../../../core/wire/admin.js';
import { startCoordinator } from '../../../coordinator/server.js';
import { backend } from '../../harness/fixtures.js';
import {
  admin,
  coordinatorFixture,
  eventually,
  reader,
  testConfig,
  uniqueNamespace,
} from '../../helpers/coordinator-fixture.js';

const json = { 'content-type': 'application/json' };

describe('coordinator persistence', { timeout: 30_000 }, () => {
  it('serves the same policies, ETags and audit trail from a new coordinator on the same NATS', async () => {
    const namespace = uniqueNamespace();
    {
      await using first = await coordinatorFixture({ namespace });
      for (const [name, capacity] of [
        ['writes', 10],
        ['reads', 100],
      ] as const) {
        const r = await first.app.inject({
          method: 'PUT',
          url: `/v1/policies/${name}`,
          headers: { ...admin, ...json },
          payload: JSON.stringify({ capacity, refillPerSecond: 2 }),
        });
        expect(r.statusCode).toBe(201);
      }
      await first.app.inject({
        method: 'PATCH',
        url: '/v1/policies/writes/budget',
        headers: { ...admin, ...json },
        payload: JSON.stringify({ capacity: 20 }),
      });
    }
    await using second = await coordinatorFixture({ namespace });
    const got = await second.app.inject({ url: '/v1/policies/writes', headers: reader });
    expect(got.statusCode).toBe(200);
    expect(got.headers.etag).toBe('"3"');
    expect(got.json()).toMatchObject({ name: 'writes', capacity: 20, refillPerSecond: 2 });
    const list = await second.app.inject({ url: '/v1/policies', headers: reader });
    expect(list.json<{ policies: { name: string }[] }>().policies.map((p) => p.name)).toEqual([
      'reads',
      'writes',
    ]);
    const trail = (await second.app.inject({ url: '/v1/audit', headers: reader })).json<AuditResponse>();
    expect(trail.entries.map((e) => e.action)).toEqual(['budget', 'create', 'create']);
    // A conditional write against the ETag the first coordinator handed out still works.
    const conditional = await second.app.inject({
      method: 'PATCH',
      url: '/v1/policies/writes/budget',
      headers: { ...admin, ...json, 'if-match': '"3"' },
      payload: JSON.stringify({ capacity: 30 }),
    });
    expect(conditional.statusCode).toBe(200);
    expect((await second.metrics.policies.get()).values[0]?.value).toBe(2);
  });

  it('answers 503 while NATS is down, writes nothing, and recovers with its data when NATS returns', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    await using f = await coordinatorFixture({ natsUrl: nats.url, natsTimeoutMs: 500 });
    const created = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/p',
      headers: { ...admin, ...json },
      payload: JSON.stringify({ capacity: 10, refillPerSecond: 1 }),
    });
    expect(created.statusCode).toBe(201);

    await nats.stop();
    await eventually(
      async () => (await f.app.inject({ url: '/readyz' })).statusCode === 503,
      5000,
      'readyz turns 503 after NATS stops',
    );
    expect((await f.app.inject({ url: '/readyz' })).json()).toEqual({
      ready: false,
      reasons: ['nats disconnected'],
    });
    const read = await f.app.inject({ url: '/v1/policies/p', headers: reader });
    expect(read.statusCode).toBe(503);
    expect(read.headers['retry-after']).toBe('1');
    expect(read.json()).toMatchObject({ code: 'COORD_ERR_STORE_UNAVAILABLE' });
    const write = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/p',
      headers: { ...admin, ...json },
      payload: JSON.stringify({ capacity: 99, refillPerSecond: 1 }),
    });
    expect(write.statusCode).toBe(503);
    const errors = (await f.metrics.kvErrors.get()).values;
    expect(errors.find((v) => v.labels.op === 'get')?.value).toBeGreaterThanOrEqual(2);

    await nats.start();
    await eventually(
      async () => (await f.app.inject({ url: '/readyz' })).statusCode === 200,
      10_000,
      'readyz turns 200 after NATS returns',
    );
    const after = await f.app.inject({ url: '/v1/policies/p', headers: reader });
    expect(after.statusCode).toBe(200);
    expect(after.headers.etag).toBe('"1"');
    expect(after.json()).toMatchObject({ capacity: 10 });
  });
});

describe('coordinator shutdown', { timeout: 30_000 }, () => {
  it('turns not ready, finishes the request in flight, stops listening and drains NATS', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    // Slack for a loaded machine: the grace covers the readiness probe, the NATS deadline the paused write.
    const config = {
      ...testConfig({ natsUrl: nats.url, namespace: uniqueNamespace(), natsTimeoutMs: 5000 }),
      shutdownGraceMs: 1500,
    };
    const running = await startCoordinator(config);
    const url = running.url;
    const putPolicy = (capacity: number) =>
      fetch(`${url}/v1/policies/p`, {
        method: 'PUT',
        headers: { ...admin, ...json },
        body: JSON.stringify({ capacity, refillPerSecond: 1 }),
      });
    expect((await putPolicy(10)).status).toBe(201);

    // Freeze NATS so the next write is still in flight when shutdown begins.
    await nats.pause();
    const inFlight = putPolicy(20);
    await eventually(() => running.app.lifecycle.inFlight === 1, 5000, 'the write reached the coordinator');
    const stopped = running.stop();
    const ready = await fetch(`${url}/readyz`);
    expect(ready.status).toBe(503);
    expect(await ready.json()).toEqual({ ready: false, reasons: ['draining'] });
    await nats.resume();
    const finished = await inFlight;
    expect(finished.status).toBe(200);
    expect(await finished.json()).toMatchObject({ capacity: 20 });
    await stopped;
    expect(running.nc.isClosed()).toBe(true);
    await expect(fetch(`${url}/healthz`)).rejects.toThrow();
  });

  it('does not wait for a connection that never sent a request, as browsers open them', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    const running = await startCoordinator(testConfig({ natsUrl: nats.url, namespace: uniqueNamespace() }));
    const { port } = new URL(running.url);
    const idle = connect({ host: '127.0.0.1', port: Number(port) });
    await once(idle, 'connect');
    const closed = once(idle, 'close');
    const started = performance.now();
    await running.stop();
    await closed;
    // Without closing it, the stop waited out Node's 60 s headers timeout.
    expect(performance.now() - started).toBeLessThan(10_000);
  });

  it('runs the protocol engine it is given: its view in the API, its readiness, stopped before NATS drains', async () => {
    await using nats = await backend().startNats({ jetstream: true });
    const config = testConfig({ natsUrl: nats.url, namespace: uniqueNamespace() });
    const events: string[] = [];
    let engineReady = false;
    let natsOpenAtStop = false;
    const running = await startCoordinator(config, {
      engine: async (ctx) => {
        ctx.policies.onChange((c) => events.push(`${c.kind}:${c.name}`));
        events.push(`start:${ctx.names.allocations}:${(await ctx.policies.list()).length}`);
        return {
          allocations: () => [],
          regions: () => [{ region: 'eu', lastReportAt: null, agents: 3, reportLagMs: null }],
          reasons: () => (engineReady ? [] : ['engine learning']),
          stop: async () => {
            natsOpenAtStop = !ctx.nc.isClosed() && !ctx.nc.isDraining();
            events.push('stop');
            return Promise.resolve();
          },
        };
      },
    });
    try {
      const ready = await fetch(`${running.url}/readyz`);
      expect(ready.status).toBe(503);
      expect(await ready.json()).toEqual({ ready: false, reasons: ['engine learning'] });
      engineReady = true;
      expect((await fetch(`${running.url}/readyz`)).status).toBe(200);
      const regions = await fetch(`${running.url}/v1/regions`, { headers: reader });
      expect(await regions.json()).toMatchObject({
        regions: [{ region: 'us' }, { region: 'eu', agents: 3 }, { region: 'ap' }],
      });
      const created = await fetch(`${running.url}/v1/policies/p`, {
        method: 'PUT',
        headers: { ...admin, ...json },
        body: JSON.stringify({ capacity: 1, refillPerSecond: 1 }),
      });
      expect(created.status).toBe(201);
    } finally {
      await running.stop();
    }
    expect(events).toEqual([`start:${config.kvNamespace}-allocations:0`, 'create:p', 'stop']);
    expect(natsOpenAtStop).toBe(true);
  });
});
