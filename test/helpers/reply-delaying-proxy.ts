import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * A TCP proxy in front of Redis that, asked to, holds Redis's replies on a connection for `ms` after the next
 * command containing `match` goes through: the command runs at once, its answer (and any behind it) comes late.
 * Or drops them: the command runs, and its connection closes before the reply reaches the client.
 */
export async function replyDelayingProxy(target: { host: string; port: number }) {
  let pending: { match: string; ms: number } | undefined;
  let dropping: string | undefined;
  /** Resolves when the command `delayRepliesAfter` waits for has gone through (its reply held from then). */
  let matched: Promise<void> = Promise.resolve();
  let onMatch: () => void = () => undefined;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect(target);
    for (const s of [client, upstream]) {
      s.setNoDelay(true);
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => s.destroy());
    }
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    let holdUntil = 0;
    let lastDue = 0;
    let drop = false;
    client.on('data', (chunk: Buffer) => {
      if (dropping !== undefined && chunk.toString('latin1').includes(dropping)) {
        dropping = undefined;
        drop = true;
      }
      if (pending !== undefined && chunk.toString('latin1').includes(pending.match)) {
        holdUntil = Date.now() + pending.ms;
        pending = undefined;
        onMatch();
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (drop) {
        client.destroy();
        return;
      }
      // In order: a reply never overtakes one held before it.
      const due = Math.max(holdUntil, lastDue, Date.now());
      lastDue = due;
      if (due <= Date.now()) client.write(chunk);
      else setTimeout(() => client.writable && client.write(chunk), due - Date.now());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  const port = address !== null && typeof address === 'object' ? address.port : 0;
  return {
    url: `redis://127.0.0.1:${port}`,
    delayRepliesAfter(match: string, ms: number) {
      pending = { match, ms };
      matched = new Promise((resolve) => (onMatch = resolve));
    },
    /** The next command containing `match` runs; its reply is lost with its connection. Undefined: disarm. */
    dropReplyAfter(match: string | undefined) {
      dropping = match;
    },
    /** When the command the last `delayRepliesAfter` named has gone through to Redis. */
    matched(): Promise<void> {
      return matched;
    },
    async [Symbol.asyncDispose]() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
