/**
 * A TCP proxy on a loopback port that a test can cut (every connection dropped, new ones refused) and restore
 * (accepting again on the same port): a network partition between one client and a real server. With a delay it
 * is a link between regions: every chunk is held for the one-way delay (plus jitter) in each direction, in order.
 */
import { spawn } from 'node:child_process';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { z } from 'zod';

/** How a proxy delays traffic. */
export interface LinkDelay {
  /** Added to every chunk in each direction, ms: a round trip costs twice that. */
  readonly delayMs: number;
  /**
   * Each chunk's delay varies uniformly within ± this fraction of `delayMs` (0.1: ±10 %), never reordering a
   * connection's chunks: a chunk leaves no earlier than the one before it.
   */
  readonly jitter: number;
}

/** Counts of what a proxy carried, and the connections it holds now. */
export interface ProxyStats {
  /** Connections accepted since it started. */
  readonly accepted: number;
  /** Connections open now. */
  readonly open: number;
  /** Bytes relayed, both directions. */
  readonly bytes: number;
  /**
   * The local ports of its open connections to the target: what the target sees as the peer's port, so a test
   * can tell a connection through the proxy from a direct one.
   */
  readonly upstreamPorts: readonly number[];
}

export interface TcpProxy extends AsyncDisposable {
  /** `host:port` clients connect to. */
  readonly port: number;
  /** The delay in force. */
  readonly delay: LinkDelay;
  /** Close every connection and refuse new ones (a partition). */
  cut(): Promise<void>;
  /** Accept again, on the same port. Does nothing if it is accepting. */
  restore(): Promise<void>;
  /** Whether it is cut. */
  readonly isCut: boolean;
  /** Change the delay for chunks that arrive from now on. */
  setDelay(delay: Partial<LinkDelay>): void;
  stats(): ProxyStats;
}

export interface TcpProxyOptions {
  /** One-way delay, ms (default 0: bytes pass as they come). */
  delayMs?: number;
  /** Jitter as a fraction of the delay (default 0). */
  jitter?: number;
  /** Port to listen on (default 0: any free port). */
  port?: number;
  /** Uniform randomness in [0, 1) for the jitter (default Math.random). */
  random?: () => number;
}

/**
 * Relays `from` → `to`, each chunk due `delay` after it arrived, never before the chunk ahead of it: one timer
 * for the head of a queue, so order holds whatever the jitter draws.
 */
function delayedRelay(
  from: Socket,
  to: Socket,
  delay: () => LinkDelay,
  random: () => number,
  count: (n: number) => void,
): void {
  const queue: { due: number; chunk: Buffer }[] = [];
  let lastDue = 0;
  let timer: NodeJS.Timeout | undefined;
  const flush = (): void => {
    timer = undefined;
    const now = performance.now();
    while (queue.length > 0 && queue[0]!.due <= now) {
      const { chunk } = queue.shift()!;
      if (to.writable) to.write(chunk);
    }
    if (queue.length > 0) timer = setTimeout(flush, Math.max(0, queue[0]!.due - now));
  };
  from.on('data', (chunk: Buffer) => {
    count(chunk.length);
    const { delayMs, jitter } = delay();
    if (delayMs <= 0 && queue.length === 0) {
      if (to.writable) to.write(chunk);
      return;
    }
    const spread = delayMs * jitter * (2 * random() - 1);
    lastDue = Math.max(performance.now() + delayMs + spread, lastDue);
    queue.push({ due: lastDue, chunk });
    timer ??= setTimeout(flush, Math.max(0, lastDue - performance.now()));
  });
  from.on('close', () => {
    if (timer !== undefined) clearTimeout(timer);
    queue.length = 0;
  });
}

export async function tcpProxy(
  target: { host: string; port: number },
  options: TcpProxyOptions = {},
): Promise<TcpProxy> {
  let delay: LinkDelay = { delayMs: options.delayMs ?? 0, jitter: options.jitter ?? 0 };
  const random = options.random ?? Math.random;
  const sockets = new Set<Socket>();
  const upstreams = new Set<Socket>();
  let server: Server | undefined;
  let port = options.port ?? 0;
  let accepted = 0;
  let bytes = 0;
  const count = (n: number) => (bytes += n);

  const listen = (): Promise<void> =>
    server !== undefined
      ? Promise.resolve()
      : new Promise((resolve, reject) => {
          const s = createServer((client) => {
            accepted++;
            const upstream = connect(target);
            upstreams.add(upstream);
            upstream.on('close', () => upstreams.delete(upstream));
            for (const sock of [client, upstream]) {
              // No Nagle: a delayed small write must leave when it is due, not wait for an ACK.
              sock.setNoDelay(true);
              sockets.add(sock);
              sock.on('close', () => sockets.delete(sock));
              sock.on('error', () => sock.destroy());
            }
            delayedRelay(client, upstream, () => delay, random, count);
            delayedRelay(upstream, client, () => delay, random, count);
            client.on('close', () => upstream.destroy());
            upstream.on('close', () => client.destroy());
          });
          s.once('error', reject);
          s.listen(port, '127.0.0.1', () => {
            const address = s.address();
            if (address !== null && typeof address === 'object') port = address.port;
            server = s;
            resolve();
          });
        });

  const cut = async (): Promise<void> => {
    const s = server;
    server = undefined;
    for (const sock of sockets) sock.destroy();
    if (s !== undefined) await new Promise<void>((resolve) => s.close(() => resolve()));
  };

  await listen();
  return {
    get port() {
      return port;
    },
    get delay() {
      return delay;
    },
    get isCut() {
      return server === undefined;
    },
    cut,
    restore: listen,
    setDelay(next) {
      delay = { ...delay, ...next };
    },
    stats: () => ({
      accepted,
      open: upstreams.size,
      bytes,
      upstreamPorts: [...upstreams].flatMap((s) => (s.localPort === undefined ? [] : [s.localPort])),
    }),
    [Symbol.asyncDispose]: cut,
  };
}

/** Where test/load/delay-proxy-main.ts lives: proxies in a process of their own, from a ProxySpec. */
export const PROXY_MAIN = 'test/load/delay-proxy-main.ts';

const Port = z.number().int().min(0).max(65_535);

/** The links a proxy process serves (its one argument, as JSON). */
export const ProxySpec = z.strictObject({
  /** Port of the control API (0: any free one). */
  control: Port.default(0),
  links: z
    .array(
      z.strictObject({
        name: z.string().min(1).max(64),
        /** Port to listen on (0: any free one). */
        port: Port.default(0),
        target: z.strictObject({ host: z.string().min(1), port: Port }),
        delayMs: z.number().min(0).max(60_000),
        jitter: z.number().min(0).max(1).default(0),
        /** The two regions this link joins, for /partition, /cut and /round-trip. */
        between: z.tuple([z.string().min(1), z.string().min(1)]).optional(),
      }),
    )
    .min(1),
});
export type ProxySpec = z.input<typeof ProxySpec>;

/** What the proxy process prints first. */
export interface ProxyPorts {
  readonly control: number;
  readonly links: Record<string, number>;
}

/** One link as the proxy process's control API reports it. */
export interface LinkState extends ProxyStats {
  readonly name: string;
  readonly port: number;
  readonly between: readonly [string, string] | undefined;
  readonly delayMs: number;
  readonly jitter: number;
  readonly cut: boolean;
}

/** The control API of a proxy process (test/load/delay-proxy-main.ts): partitions and round trips by region. */
export class LinkControl {
  readonly url: string;

  constructor(url: string) {
    this.url = url;
  }

  async #call(method: string, path: string, body?: unknown): Promise<unknown> {
    const res = await fetch(`${this.url}${path}`, {
      method,
      ...(body === undefined
        ? {}
        : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    });
    const value = (await res.json()) as unknown;
    if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(value)}`);
    return value;
  }

  async links(): Promise<LinkState[]> {
    return (await this.#call('GET', '/links')) as LinkState[];
  }

  /** Cut every link of `region`: its sockets close, new connections are refused. */
  async partition(region: string): Promise<void> {
    await this.#call('POST', `/partition/${encodeURIComponent(region)}`);
  }

  /** Accept again on every link of `region`. */
  async heal(region: string): Promise<void> {
    await this.#call('POST', `/heal/${encodeURIComponent(region)}`);
  }

  /** Cut the links between two regions. */
  async cut(a: string, b: string): Promise<void> {
    await this.#call('POST', `/cut/${encodeURIComponent(a)}/${encodeURIComponent(b)}`);
  }

  /** Accept again on the links between two regions. */
  async restore(a: string, b: string): Promise<void> {
    await this.#call('POST', `/heal/${encodeURIComponent(a)}/${encodeURIComponent(b)}`);
  }

  /** Set the round trip (and optionally the jitter) of both directions between two regions. */
  async setRoundTrip(a: string, b: string, roundTripMs: number, jitter?: number): Promise<void> {
    await this.#call('PUT', `/round-trip/${encodeURIComponent(a)}/${encodeURIComponent(b)}`, {
      roundTripMs,
      ...(jitter === undefined ? {} : { jitter }),
    });
  }
}

/** A proxy process started by `spawnProxies`. */
export interface ProxyProcess extends AsyncDisposable {
  readonly ports: ProxyPorts;
  readonly control: LinkControl;
  readonly pid: number;
}

/**
 * Start test/load/delay-proxy-main.ts with `spec` (from the repository root `cwd`) and wait for its ports.
 * Disposing it stops it (SIGTERM) and waits for its exit.
 */
export async function spawnProxies(spec: ProxySpec, cwd: string): Promise<ProxyProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', PROXY_MAIN, JSON.stringify(spec)], {
    cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  try {
    const ports = await new Promise<ProxyPorts>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        const nl = out.indexOf('\n');
        if (nl >= 0) resolve(JSON.parse(out.slice(0, nl)) as ProxyPorts);
      });
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      child.once('exit', (code) => reject(new Error(`the proxy process exited (${code}):\n${out}`)));
    });
    return {
      ports,
      control: new LinkControl(`http://127.0.0.1:${ports.control}`),
      pid: child.pid ?? 0,
      [Symbol.asyncDispose]: stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
