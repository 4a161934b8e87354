import { closeSync, mkdirSync, openSync, statSync, utimesSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Where `freePort` draws from: below Linux's ephemeral range (32768-60999 by default). A port the kernel hands
 * out for `listen(0)` or an outgoing connection can be handed again to another process (a proxy binding its
 * links, a client connecting) between the moment a test reads it and the moment its server binds it: a geo
 * topology's NATS monitor port was lost that way once. Ports drawn here are never handed out by the kernel.
 */
const DRAW_FROM = 20_000;
const DRAW_TO = 32_767;

/** Whether 127.0.0.1:`port` can be listened on now. */
function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/**
 * How long a port `freePort` handed out stays reserved: nothing listens on it until its caller's server binds it
 * (a container start takes seconds), and until then the probe sees it free. Without the reservation a geo topology's
 * nine ports, drawn one after another before any server starts, could hold the same port twice, and a test
 * running beside it could draw one of them: its NATS server then exits at once, "address already in use".
 */
const RESERVED_MS = 5 * 60_000;

/** Ports this process handed out, with when. */
const handedOut = new Map<number, number>();

/**
 * Where every test process (vitest's workers, the global setup) marks the ports it handed out: one empty file per
 * port, created exclusively, stale after RESERVED_MS.
 */
const RESERVATIONS = join(tmpdir(), 'quotaplane-test-ports');

/** Reserve `port` for this process, unless this or another process reserved it less than RESERVED_MS ago. */
function reserve(port: number): boolean {
  const now = Date.now();
  const mine = handedOut.get(port);
  if (mine !== undefined && now - mine < RESERVED_MS) return false;
  try {
    mkdirSync(RESERVATIONS, { recursive: true });
    const file = join(RESERVATIONS, String(port));
    try {
      closeSync(openSync(file, 'wx'));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      if (now - statSync(file).mtimeMs < RESERVED_MS) return false;
      utimesSync(file, new Date(now), new Date(now));
    }
  } catch {
    // No shared directory to mark it in (read-only, removed meanwhile): this process's own record still holds.
  }
  handedOut.set(port, now);
  return true;
}

/**
 * A TCP port on 127.0.0.1 that was free a moment ago, drawn at random below the ephemeral range (DRAW_FROM) and
 * handed out by no test process in the last RESERVED_MS (two calls, even concurrent ones, never get the same
 * port); the kernel's choice only if no drawn port is free.
 */
export async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = DRAW_FROM + Math.floor(Math.random() * (DRAW_TO - DRAW_FROM + 1));
    // Reserved before the probe, synchronously: a concurrent call cannot probe the same port meanwhile.
    if (!reserve(port)) continue;
    if (await canListen(port)) return port;
  }
  return anyPort();
}

/** A port the kernel picks for `listen(0)`. */
function anyPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => {
        if (address !== null && typeof address === 'object') resolve(address.port);
        else reject(new Error('no port'));
      });
    });
  });
}

/** Resolve once something accepts TCP connections on host:port, or reject after `timeoutMs`. */
export async function waitForPort(host: string, port: number, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const socket = connect({ host, port });
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on ${host}:${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Redis refuses cluster mode above this port: its cluster bus listens on port + 10000. */
export const MAX_CLUSTER_PORT = 65_535 - 10_000;

/**
 * A free port for a Redis Cluster node: at most MAX_CLUSTER_PORT, with its bus port (+10000) free too, and none
 * of `avoid` (ports, and so bus ports, of the other nodes).
 */
export async function freeClusterPort(avoid: readonly number[] = []): Promise<number> {
  const busFree = canListen;
  for (let attempt = 0; attempt < 1000; attempt++) {
    const port = await freePort();
    if (port > MAX_CLUSTER_PORT || avoid.includes(port) || avoid.includes(port + 10_000)) continue;
    if (await busFree(port + 10_000)) return port;
  }
  throw new Error('no free port for a Redis Cluster node');
}

/** The arguments of a Redis cluster node the harness starts (either backend): cluster mode, a 2 s node timeout. */
export const CLUSTER_NODE_ARGS: readonly string[] = [
  '--cluster-enabled',
  'yes',
  '--cluster-config-file',
  'nodes.conf',
  '--cluster-node-timeout',
  '2000',
];
