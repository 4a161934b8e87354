import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { slidingLogKey } from '../../../../core/models/sliding-log.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'guesses', kind: 'sliding_log', capacity: 5, windowSeconds: 600, maxCost: 5 }),
  parsePolicy({ name: 'ip-guesses', kind: 'sliding_log', capacity: 3, windowSeconds: 600, maxCost: 3 }),
];

let agent: AgentFixture;
let cluster: Cluster;

beforeAll(async () => {
  agent = await agentFixture({ policies, redis: 'cluster' });
  cluster = agent.redis as Cluster;
});
afterAll(async () => {
  await agent[Symbol.asyncDispose]();
});

async function decide(body: object) {
  const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
  expect(res.statusCode, res.body).toBe(200);
  return DecisionResponse.parse(res.json());
}

describe('sliding logs on a real 3-master Redis Cluster', () => {
  it('layered logs in different slots: a later slot that denies takes the earlier entries back', async () => {
    const ip = uniquePrefix('ip');
    let account = uniquePrefix('acct');
    while (
      calculateSlot(slidingLogKey(1, account, 'guesses')) ===
      calculateSlot(slidingLogKey(1, ip, 'ip-guesses'))
    ) {
      account = uniquePrefix('acct');
    }
    const body = {
      checks: [
        { policy: 'guesses', subject: account, cost: 2 },
        { policy: 'ip-guesses', subject: ip, cost: 2 },
      ],
    };
    expect((await decide(body)).allowed).toBe(true);
    const denied = await decide(body);
    expect(denied.allowed).toBe(false);
    expect(denied.results.map((r) => r.remaining)).toEqual([3, 1]);
    expect(await cluster.zcount(slidingLogKey(1, account, 'guesses'), '(-inf', '+inf')).toBe(2);
    expect(await cluster.zcount(slidingLogKey(1, ip, 'ip-guesses'), '(-inf', '+inf')).toBe(2);
    // The account still has its three guesses: the refunded entries came back.
    expect((await decide({ policy: 'guesses', subject: account, cost: 3 })).allowed).toBe(true);
  });

  it('500 racing callers through the agent on one subject admit exactly the limit', async () => {
    const subject = uniquePrefix('race');
    const all = await Promise.all(Array.from({ length: 500 }, () => decide({ policy: 'guesses', subject })));
    expect(all.filter((d) => d.allowed)).toHaveLength(5);
    expect(await cluster.zcount(slidingLogKey(1, subject, 'guesses'), '(-inf', '+inf')).toBe(5);
  });
});
