/**
 * A TCP proxy on a loopback port that a test can cut (every connection dropped, new ones refused) and restore
 * (accepting again on the same port): a network partition between one client and a real server.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface TcpProxy extends AsyncDisposable {
  /** `host:port` clients connect to. */
  readonly port: number;
  cut(): Promise<void>;
  restore(): Promise<void>;
}

/** `delayMs`: added to every chunk in each direction (a round trip costs twice that), order kept. */
export async function tcpProxy(
  target: { host: string; port: number },
  options: { delayMs?: number } = {},
): Promise<TcpProxy> {
  const delayMs = options.delayMs ?? 0;
  const relay = (from: Socket, to: Socket): void => {
    if (delayMs <= 0) {
      from.pipe(to);
      return;
    }
    // Timers of equal delay fire in the order they were set: chunks arrive in order, each delayMs late.
    from.on('data', (chunk: Buffer) => setTimeout(() => to.writable && to.write(chunk), delayMs));
  };
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let port = 0;

  const listen = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const s = createServer((client) => {
        const upstream = connect(target);
        for (const sock of [client, upstream]) {
          // No Nagle: a delayed small write must leave when it is due, not wait for an ACK.
          sock.setNoDelay(true);
          sockets.add(sock);
          sock.on('close', () => sockets.delete(sock));
          sock.on('error', () => sock.destroy());
        }
        relay(client, upstream);
        relay(upstream, client);
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
    cut,
    restore: listen,
    [Symbol.asyncDispose]: cut,
  };
}
