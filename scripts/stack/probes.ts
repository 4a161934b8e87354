/**
 * Is a server up yet: Redis answers PING and NATS sends its INFO line, checked over plain sockets so the same
 * probes work for local binaries and for containers, with no client library and no redis-cli.
 */
import { connect } from 'node:net';
import { Redis } from 'ioredis';

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** One PING over a fresh connection: true when the server answers PONG. */
export function redisPing(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    let reply = '';
    const done = (ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.on('data', (d: Buffer) => {
      reply += d.toString('utf8');
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'));
    });
    socket.once('error', () => done(false));
  });
}

/** The first line a NATS server sends (`INFO {...}`), parsed; undefined when it does not answer. */
export function natsInfo(
  host: string,
  port: number,
  timeoutMs = 1000,
): Promise<Record<string, unknown> | undefined> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    let text = '';
    const done = (info: Record<string, unknown> | undefined) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(info);
    };
    const timer = setTimeout(() => done(undefined), timeoutMs);
    socket.on('data', (d: Buffer) => {
      text += d.toString('utf8');
      const end = text.indexOf('\r\n');
      if (end < 0) return;
      const line = text.slice(0, end);
      if (!line.startsWith('INFO ')) return done(undefined);
      try {
        done(JSON.parse(line.slice(5)) as Record<string, unknown>);
      } catch {
        done(undefined);
      }
    });
    socket.once('error', () => done(undefined));
  });
}

/** Poll `probe` every 50 ms until it is true; throws `what` after `timeoutMs`. */
export async function until(probe: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await probe()) return;
    if (Date.now() > deadline) throw new Error(`${what} (waited ${timeoutMs} ms)`);
    await sleep(50);
  }
}

/** The JSON of a NATS monitoring endpoint (`http://host:port/routez`), or undefined when it does not answer. */
export async function monitorJson(url: string): Promise<Record<string, unknown> | undefined> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
    if (res.status !== 200) {
      await res.body?.cancel();
      return undefined;
    }
    return (await res.json()) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/**
 * Whether the NATS servers whose monitoring ports are `monitors` (`http://host:port`) form one cluster ready for
 * JetStream: each holds routes to every other, and the JetStream meta leader sees every other server current
 * (until then a stream with one replica per server cannot be placed).
 */
export async function natsClusterFormed(monitors: readonly string[]): Promise<boolean> {
  const states = await Promise.all(
    monitors.map(async (base) => {
      const [routez, jsz, varz] = await Promise.all(
        ['routez', 'jsz', 'varz'].map((p) => monitorJson(`${base}/${p}`)),
      );
      const routes = (routez?.['routes'] ?? []) as { remote_id?: string }[];
      const perPeer = new Map<string | undefined, number>();
      for (const r of routes) perPeer.set(r.remote_id, (perPeer.get(r.remote_id) ?? 0) + 1);
      const peers = new Set(perPeer.keys());
      const meta = jsz?.['meta_cluster'] as
        { leader?: string; replicas?: { current?: boolean }[] } | undefined;
      const leader = meta?.leader ?? '';
      return {
        // As many routes to each peer: two servers that dialled each other at once hold both routes until one
        // drops its duplicate, and a cluster is not settled before then. Equal, not one: nats-server 2.10 keeps
        // a pool of routes per peer (3 by default).
        routed: peers.size === monitors.length - 1 && new Set(perPeer.values()).size <= 1,
        // Only the leader lists the other peers.
        current:
          leader !== '' && leader === varz?.['server_name']
            ? (meta?.replicas ?? []).filter((p) => p.current === true).length
            : undefined,
        led: leader !== '',
      };
    }),
  );
  const current = states.find((s) => s.current !== undefined)?.current;
  return states.every((s) => s.routed && s.led) && current === monitors.length - 1;
}

/** Whether every sentinel on `ports` knows `replicas` replicas of `masterName` (they learn them from its INFO). */
export async function sentinelsKnowReplicas(
  host: string,
  ports: readonly number[],
  masterName: string,
  replicas: number,
): Promise<boolean> {
  const counts = await Promise.all(
    ports.map(async (port) => {
      const client = new Redis({
        host,
        port,
        lazyConnect: true,
        maxRetriesPerRequest: 0,
        connectTimeout: 1000,
      });
      client.on('error', () => undefined);
      try {
        await client.connect();
        return ((await client.call('SENTINEL', 'REPLICAS', masterName)) as unknown[]).length;
      } catch {
        return -1;
      } finally {
        client.disconnect();
      }
    }),
  );
  return counts.every((n) => n === replicas);
}
