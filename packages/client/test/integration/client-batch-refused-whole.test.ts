/**
 * Coalesced decisions are independent: one caller's body the agent cannot read at all must not refuse the
 * decisions that shared its batch. A body with an own `__proto__` key (what `JSON.parse` of a caller's JSON, or a
 * spread of it, gives) makes the agent's JSON parser refuse the whole `POST /v1/decisions/batch` (400
 * AGT_ERR_MALFORMED_JSON); the client answered that refusal to every decision of the batch, so its neighbours'
 * callers got AgentRequestError (the plugin's 500 QUOTA_MISCONFIGURED) and were counted as refused.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../../test/helpers/agent-fixture.js';
import { AgentClient, AgentRequestError } from '../../src/agent-client.js';

let agent: AgentFixture;
let client: AgentClient;

beforeAll(async () => {
  agent = await agentFixture({
    policies: [parsePolicy({ name: 'work', capacity: 1000, refillPerSecond: 100 })],
    listen: true,
  });
  // Coalescing on (the default); grants off, so every decision is the agent's.
  client = new AgentClient({ baseUrl: agent.url, timeoutMs: 5000, grants: false });
}, 30_000);

afterAll(async () => {
  client?.close();
  await agent?.[Symbol.asyncDispose]();
});

describe('a batch the agent refuses whole', () => {
  it('one body with a __proto__ key is refused alone; its neighbours are decided', async () => {
    const tenant = uniquePrefix('proto');
    const odd = JSON.parse(`{"policy":"work","subject":"${tenant}-odd","__proto__":{"x":1}}`) as never;
    const batches = client.stats().batches;
    const [a, refused, b] = await Promise.allSettled([
      client.check('work', `${tenant}-a`),
      client.decide(odd),
      client.check('work', `${tenant}-b`),
    ]);
    expect(client.stats().batches).toBe(batches + 1);
    expect(refused.status).toBe('rejected');
    expect((refused as PromiseRejectedResult).reason).toBeInstanceOf(AgentRequestError);
    expect((refused as PromiseRejectedResult).reason).toMatchObject({ code: 'AGT_ERR_MALFORMED_JSON' });
    for (const r of [a, b]) {
      expect(r.status).toBe('fulfilled');
      const decision = (r as PromiseFulfilledResult<{ allowed: boolean; degraded?: string }>).value;
      expect(decision.allowed).toBe(true);
      expect(decision.degraded).toBeUndefined();
    }
    expect(client.stats().refused).toEqual({ AGT_ERR_MALFORMED_JSON: 1 });
    expect(client.stats().breaker).toBe('closed');
  });
});
