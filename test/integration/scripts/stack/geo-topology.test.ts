/**
 * The geo topology itself (test/helpers/geo-topology.ts), checked from outside: three servers in one cluster,
 * every route through a proxy and none around them (each server's /routez), a request/reply between regions
 * taking at least the configured round trip, a partition that isolates a region and a heal that joins it again,
 * and JetStream with a replica in every region.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { describe, expect, it } from 'vitest';
import { startGeoTopology, type GeoTopology } from '../../../helpers/geo-topology.js';
import { eventually } from '../../../helpers/wait.js';

/** The slowest of `n` request/replies from a client of `from` to a responder on `to`'s server, and the fastest. */
async function roundTrips(geo: GeoTopology, from: string, to: string, n: number): Promise<number[]> {
  const responder = await connect({ servers: geo.natsUrl(to) });
  const requester = await connect({ servers: geo.natsUrl(from) });
  try {
    const subject = `geo.echo.${to}`;
    responder.subscribe(subject, { callback: (_e, m) => void m.respond(m.data) });
    await responder.flush();
    // Interest crosses the route before the first request can find a responder.
    await eventually(() => canReach(requester, subject), 10_000, `a responder of ${to} seen from ${from}`);
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const started = performance.now();
      await requester.request(subject, 'ping', { timeout: 5000 });
      out.push(performance.now() - started);
    }
    return out;
  } finally {
    await requester.close();
    await responder.close();
  }
}

async function canReach(from: NatsConnection, subject: string): Promise<boolean> {
  try {
    await from.request(subject, 'ping', { timeout: 1500 });
    return true;
  } catch {
    return false;
  }
}

describe('geo topology', () => {
  it('forms one cluster whose routes all cross the proxies, at the configured round trips', async () => {
    await using geo = await startGeoTopology({ redis: false });
    for (const region of geo.regions) {
      // Each peer once (nats-server 2.10 pools several routes per peer; formed() waited for duplicates to go).
      const names = [...new Set((await geo.routes(region)).map((r) => r.remoteName))].sort();
      expect(names).toEqual(
        geo.regions
          .filter((r) => r !== region)
          .map((r) => `qp-${r}`)
          .sort(),
      );
    }
    expect(await geo.directRoutes()).toEqual([]);
    for (const [a, b] of [
      ['us', 'eu'],
      ['us', 'ap'],
      ['eu', 'ap'],
    ] as const) {
      const rtt = geo.roundTripMs(a, b);
      const measured = await roundTrips(geo, a, b, 5);
      // A reply can be late on a busy machine, never early: each direction waits at least delay × (1 − jitter).
      expect(Math.min(...measured)).toBeGreaterThanOrEqual(rtt * 0.9);
    }
    // Within a region nothing crosses a link.
    const local = await roundTrips(geo, 'ap', 'ap', 5);
    expect(Math.min(...local)).toBeLessThan(geo.roundTripMs('us', 'eu') * 0.9);
  });

  it('opens no route around a slow link, though gossip tells of the far server long before its link answers', async () => {
    // eu hears of ap through us within milliseconds, and its own route to ap takes a second or more to handshake: a
    // server left to itself dials ap's advertised address directly (an implicit route around the link).
    await using geo = await startGeoTopology({ redis: false, roundTrips: 'us-eu=20,us-ap=20,eu-ap=1000' });
    expect(await geo.directRoutes()).toEqual([]);
    expect((await geo.routes('eu')).map((r) => r.remoteName).sort()).toEqual(['qp-ap', 'qp-us']);
  }, 60_000);

  it('isolates a partitioned region and joins it again when healed', async () => {
    await using geo = await startGeoTopology({ redis: false });
    const ap = await connect({ servers: geo.natsUrl('ap') });
    const us = await connect({ servers: geo.natsUrl('us') });
    try {
      ap.subscribe('geo.ap', { callback: (_e, m) => void m.respond(m.data) });
      await ap.flush();
      await eventually(() => canReach(us, 'geo.ap'), 10_000, 'ap reachable from us');
      await geo.partition('ap');
      await eventually(async () => (await geo.routes('ap')).length === 0, 10_000, 'ap alone', 100);
      expect(await canReach(us, 'geo.ap')).toBe(false);
      // The other two still route to each other.
      expect((await geo.routes('us')).map((r) => r.remoteName)).toEqual(['qp-eu']);
      await geo.heal('ap');
      await eventually(() => canReach(us, 'geo.ap'), 20_000, 'ap reachable again', 100);
      await geo.formed(20_000);
      expect(await geo.directRoutes()).toEqual([]);
    } finally {
      await ap.close();
      await us.close();
    }
  }, 60_000);

  it('keeps a KV bucket with one replica in each region', async () => {
    await using geo = await startGeoTopology({ redis: false });
    const nc = await connect({ servers: geo.natsUrl('eu') });
    try {
      const bucket = `geo-${Date.now()}`;
      const kv = await new Kvm(jetstream(nc, { timeout: 10_000 })).create(bucket, { replicas: 3 });
      await kv.put('k', 'v');
      const info = await (await jetstream(nc).jetstreamManager()).streams.info(`KV_${bucket}`);
      const placed = [info.cluster?.leader, ...(info.cluster?.replicas ?? []).map((r) => r.name)].sort();
      expect(placed).toEqual(['qp-ap', 'qp-eu', 'qp-us']);
      expect((await kv.get('k'))?.string()).toBe('v');
    } finally {
      await nc.close();
    }
  }, 60_000);

  it('runs locked down as a deployment: each region accepts its own agents', async () => {
    await using geo = await startGeoTopology({
      redis: false,
      secure: { namespace: 'geosec', tls: true },
    });
    const security = geo.security!;
    const nc = await connect({
      servers: geo.natsUrl('ap'),
      ...security.connectOptions('agent-ap-1'),
    });
    try {
      expect(geo.natsUrl('ap').startsWith('tls://')).toBe(true);
      expect(await geo.directRoutes()).toEqual([]);
      await nc.flush();
    } finally {
      await nc.close();
    }
  }, 60_000);
});
