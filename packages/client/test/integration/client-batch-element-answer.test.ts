/**
 * Coalesced decisions are answered each on its own: one element of a batch answer the client cannot read (here a
 * result `reason` a newer agent knows and this client does not) is that decision's `bad_body`, never its
 * neighbours'. Before, the whole answer went to zod's BatchResponse, which refuses a list with one bad element,
 * and every decision of the batch was answered by its failure mode as `bad_body` (and counted by the breaker),
 * though the agent had decided its neighbours. A stand-in agent answers the batch route.
 */
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../src/agent-client.js';

let server: Server;
let client: AgentClient;

const decision = (policy: string, reason?: string) => ({
  allowed: true,
  retryAfterMs: 0,
  results: [
    {
      policy,
      allowed: true,
      remaining: 5,
      limit: 10,
      resetMs: 100,
      retryAfterMs: 0,
      mode: 'regional',
      ...(reason === undefined ? {} : { reason }),
    },
  ],
  headers: {},
});

beforeAll(async () => {
  server = createServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', () => {
      const body = JSON.parse(text) as { decisions?: { policy: string; subject: string }[] };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          answers: (body.decisions ?? []).map((d) => ({
            status: 200,
            body: decision(d.policy, d.subject === 'odd' ? 'a_reason_of_a_newer_agent' : undefined),
          })),
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  client = new AgentClient({ baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 2000, grants: false });
});

afterAll(() => {
  client.close();
  server.closeAllConnections();
  server.close();
});

describe('one element of a batch answer the client cannot read', () => {
  it('fails its own decision only', async () => {
    const [a, odd, b] = await Promise.all([
      client.check('work', 'a'),
      client.check('work', 'odd'),
      client.check('work', 'b'),
    ]);
    expect(client.stats().batches).toBe(1);
    expect(odd).toMatchObject({ allowed: false, degraded: 'fail_closed', failure: 'bad_body' });
    for (const d of [a, b]) {
      expect(d.allowed).toBe(true);
      expect(d.degraded).toBeUndefined();
      expect(d.results[0]).toMatchObject({ remaining: 5, limit: 10 });
    }
    expect(client.stats().decided).toBe(2);
    expect(client.stats().failures.bad_body).toBe(1);
  });
});
