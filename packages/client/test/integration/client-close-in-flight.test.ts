/**
 * close() sheds what the client holds and everything after it, and "nothing counts as an agent failure"
 * (docs/agent.md, Shedding). A decision already in flight when the client closes is being decided (and charged)
 * by the agent: it gets that answer. Before, close() destroyed the sockets under it (with grants off at once; with
 * grants on as soon as there was nothing to hand back), so it was answered by its failure mode as a `connection`
 * failure, counted in stats().failures and told to onFailure: every deploy's graceful shutdown looked like an
 * agent outage. The stand-in agent answers each decision after 400 ms.
 */
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, type AgentUnavailableError } from '../../src/agent-client.js';

let server: Server;
let port: number;

beforeAll(async () => {
  server = createServer((req, res) => {
    req.resume();
    req.on('end', () =>
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            allowed: true,
            retryAfterMs: 0,
            results: [
              {
                policy: 'work',
                allowed: true,
                remaining: 9,
                limit: 10,
                resetMs: 100,
                retryAfterMs: 0,
                mode: 'regional',
              },
            ],
            headers: {},
          }),
        );
      }, 400),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as { port: number }).port;
});

afterAll(() => {
  server.closeAllConnections();
  server.close();
});

describe('close() with a decision in flight', () => {
  for (const grants of [false, undefined] as const) {
    it(`the decision gets the agent's answer, no failure is counted (grants ${grants === false ? 'off' : 'on'})`, async () => {
      const failures: AgentUnavailableError[] = [];
      const client = new AgentClient({
        baseUrl: `http://127.0.0.1:${port}`,
        timeoutMs: 2000,
        ...(grants === false ? { grants: false as const } : {}),
        onFailure: (e) => failures.push(e),
      });
      const decision = client.check('work', 'tenant');
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(client.stats().inFlight).toBe(1);
      const drained = client.closeAndDrain();
      const d = await decision;
      await drained;
      expect(d.degraded).toBeUndefined();
      expect(d).toMatchObject({ allowed: true, results: [{ remaining: 9, limit: 10 }] });
      expect(failures.map((f) => f.failure)).toEqual([]);
      expect(client.stats().failures.connection).toBe(0);
      // Closed: later decisions are shed, not sent.
      await expect(client.check('work', 'tenant')).resolves.toMatchObject({ failure: 'shed' });
    });
  }
});
