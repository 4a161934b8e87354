/**
 * A reservation's checks are a decision's checks without costs: a caller that names its subject's class on its
 * decisions (docs/subject-classes.md) must be able to name it on a reservation too. Without it the reservation is
 * decided on the policy's own limits, and deciding the subject's bucket at the default size clamps an enterprise
 * tenant's tokens down to the default capacity.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { AgentApp } from '../../../../regional-agent/app.js';
import { sharedRedis, uniquePrefix } from '../../../harness/fixtures.js';
import { agentOnRedis } from '../../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({
    name: 'plans',
    capacity: 10,
    refillPerSecond: 1e-4,
    maxCost: 10,
    classes: { enterprise: { capacity: 100, refillPerSecond: 1e-3, maxCost: 100 } },
  }),
];

const redis = sharedRedis();
let agent: AgentApp;
beforeAll(async () => {
  agent = agentOnRedis(redis, policies);
  await agent.ready;
});
afterAll(async () => {
  await agent.close();
});

async function post(url: string, payload: object) {
  const res = await agent.app.inject({ method: 'POST', url, payload });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

describe('reservations name the subject class as decisions do', () => {
  it('an enterprise tenant reserves 50 of its 100 under its class; commit 20 leaves it 80', async () => {
    const subject = uniquePrefix('ent');
    const r = await post('/v1/reservations', { policy: 'plans', subject, class: 'enterprise', amount: 50 });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ allowed: true, results: [{ limit: 100, remaining: 50 }] });
    const id = (r.body['reservation'] as { id: string }).id;
    expect((await post(`/v1/reservations/${id}/commit`, { amount: 20 })).body).toMatchObject({
      refunded: 30,
    });
    const look = await post('/v1/decisions', { policy: 'plans', subject, class: 'enterprise', dryRun: true });
    expect(look.body).toMatchObject({ results: [{ limit: 100, remaining: 79 }] });
  });

  it('layered checks carry their class too; an unknown class is a 400 and charges nothing', async () => {
    const subject = uniquePrefix('ent-l');
    const r = await post('/v1/reservations', {
      checks: [{ policy: 'plans', subject, class: 'enterprise' }],
      amount: 40,
    });
    expect(r.body).toMatchObject({ allowed: true, results: [{ limit: 100, remaining: 60 }] });
    const bad = await post('/v1/reservations', { policy: 'plans', subject, class: 'gold', amount: 1 });
    expect(bad.body).toMatchObject({ status: 400, code: 'AGT_ERR_UNKNOWN_CLASS' });
  });
});
