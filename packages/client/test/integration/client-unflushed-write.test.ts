/**
 * An exchange whose request the agent never takes off the wire (an agent frozen after accepting the connection,
 * its receive window full) fails within the timeout, as one whose answer never comes does. Before, the answer's
 * timer was armed only when the write was flushed (`finish`), and the connection's timer stood down once the
 * socket was connected: a write the peer never drained had no timer at all, its decision never settled and it
 * held one of the client's exchanges for good. On loopback the kernel buffers a few MB, so the body here is an
 * oversized one (a caller's subject of 8 MB, which the agent would refuse); across a network the peer's window
 * is far smaller. The stand-in agent accepts connections and never reads.
 */
import { createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError } from '../../src/agent-client.js';

let server: Server;
const sockets: Socket[] = [];
let port: number;

beforeAll(async () => {
  server = createServer((socket) => {
    sockets.push(socket);
    socket.pause();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as { port: number }).port;
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('a request the agent never reads', () => {
  it('settles within the timeout and frees its exchange', async () => {
    const client = new AgentClient({
      baseUrl: `http://127.0.0.1:${port}`,
      timeoutMs: 300,
      grants: false,
      breaker: false,
      coalesce: false,
      maxExchanges: 1,
    });
    try {
      const started = performance.now();
      const big = client.check('work', 'x'.repeat(8_000_000)).then(
        () => 'answered',
        (error: unknown) => error,
      );
      const within = await Promise.race([
        big,
        new Promise<'pending'>((resolve) => setTimeout(() => resolve('pending'), 3000)),
      ]);
      expect(within).not.toBe('pending');
      // The agent gave no answer: the body is then refused as the agent would refuse it (its subject).
      expect(within).toBeInstanceOf(AgentRequestError);
      expect(within).toMatchObject({ code: 'AGT_ERR_INVALID_SUBJECT' });
      expect(performance.now() - started).toBeLessThan(2000);
      expect(client.stats().refused).toEqual({ AGT_ERR_INVALID_SUBJECT: 1 });
      expect(client.stats().inFlight).toBe(0);
    } finally {
      client.close();
    }
  });
});
