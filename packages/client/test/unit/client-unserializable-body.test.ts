/**
 * A body JSON.stringify answers undefined for (a function, an object whose `toJSON` returns nothing) is its
 * caller's refusal, never queued: queued, its payload (undefined) threw in the pump, outside any promise (an
 * uncaught TypeError in the service's process), and stayed at the head of the queue, so no decision after it was
 * ever sent or settled. The agent here is a port nobody listens on.
 */
import { createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError } from '../../src/agent-client.js';

let client: AgentClient;

beforeAll(async () => {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  client = new AgentClient({ baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 300, onUnavailable: 'open' });
});

afterAll(() => client.close());

describe('a body that is no JSON value', () => {
  it('is refused for its caller alone; the decisions beside it and after it are answered', async () => {
    const errors: unknown[] = [];
    const onUncaught = (error: unknown) => errors.push(error);
    process.on('uncaughtException', onUncaught);
    try {
      const odd = { policy: 'work', subject: 'odd', toJSON: () => undefined } as never;
      const settled = Promise.allSettled([
        client.check('work', 'before'),
        client.decide(odd),
        client.check('work', 'after'),
      ]);
      const within = await Promise.race([
        settled,
        new Promise<'pending'>((resolve) => setTimeout(() => resolve('pending'), 3000)),
      ]);
      expect(errors.map(String)).toEqual([]);
      expect(within).not.toBe('pending');
      const [before, refused, after] = within as PromiseSettledResult<unknown>[];
      expect(refused!.status).toBe('rejected');
      expect((refused as PromiseRejectedResult).reason).toBeInstanceOf(AgentRequestError);
      expect((refused as PromiseRejectedResult).reason).toMatchObject({ status: 400 });
      // The agent cannot be reached: its neighbours are answered by their failure mode ('open').
      for (const r of [before, after])
        expect(r).toMatchObject({ status: 'fulfilled', value: { allowed: true, degraded: 'fail_open' } });
      // And the client keeps working.
      await expect(client.check('work', 'later')).resolves.toMatchObject({
        allowed: true,
        degraded: 'fail_open',
      });
    } finally {
      process.off('uncaughtException', onUncaught);
    }
  });
});
