/**
 * The client's timeout follows the agent: every answer of the decision routes says how long the agent may take
 * (`quotaplane-answer-within-ms`, its decision deadline plus its farthest link's allowance), and a client made
 * without `timeoutMs` waits that plus 50 ms. A client with a shorter, fixed timeout gives up on a decision the
 * agent still makes and charges: the service answers 503 for a request the limiter admitted. Here the agent's
 * deadline is 1 s and the agent is frozen (SIGSTOP) for 500 ms while a decision is asked.
 */
import { describe, expect, it } from 'vitest';
import { AgentClient } from '@quotaplane/client';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentProcessOnOwnRedis } from '../../../../test/helpers/agent-process.js';

const FROZEN_MS = 500;

const own = agentProcessOnOwnRedis({
  policies: { work: { capacity: 1000, refillPerSecond: 100 } },
  env: { QP_DECISION_DEADLINE_MS: '1000', QP_STORE_TIMEOUT_MS: '900' },
});

/** Ask while the agent is frozen for FROZEN_MS; the answer once it runs again. */
async function askFrozen(client: AgentClient, subject: string) {
  own.agent.pause();
  const thaw = setTimeout(() => own.agent.resume(), FROZEN_MS);
  try {
    return await client.check('work', subject);
  } finally {
    clearTimeout(thaw);
    own.agent.resume();
  }
}

describe("the client's timeout follows the agent's answer bound", () => {
  it('learns 1,050 ms from the first answer and waits out an agent frozen for 500 ms', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, grants: false });
    try {
      const subject = uniquePrefix('follows');
      // Before the first answer: what the agent assumes of a link it has not measured (250 + 313), plus 50.
      expect(client.stats().timeoutMs).toBe(613);
      expect((await client.check('work', subject)).allowed).toBe(true);
      expect(client.stats().timeoutMs).toBe(1050);
      const late = await askFrozen(client, subject);
      expect(late).toMatchObject({ allowed: true });
      expect(late.degraded).toBeUndefined();
      expect(client.stats().failures.timeout).toBe(0);
      expect(client.stats().decided).toBe(2);
    } finally {
      client.close();
    }
  });

  it('a timeout given keeps its value: 300 ms fails the same frozen call by its failure mode', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 300, grants: false });
    try {
      const subject = uniquePrefix('fixed');
      expect((await client.check('work', subject)).allowed).toBe(true);
      expect(client.stats().timeoutMs).toBe(300);
      const late = await askFrozen(client, subject);
      expect(late).toMatchObject({ allowed: false, degraded: 'fail_closed' });
      expect(client.stats().failures.timeout).toBe(1);
    } finally {
      client.close();
    }
  });
});
