/**
 * Shed work is visible to operators: each agent counts the decision requests its admission control refused and
 * reports them in its heartbeats; the coordinator turns them into a rate per agent and per region in
 * `GET /v1/regions` (the dashboard's Shed/s columns).
 */
import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RegionsResponse } from '../../../../core/wire/admin.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';
import { eventually } from '../../../helpers/wait.js';

let stack: ServiceStack;

beforeAll(async () => {
  // One decision in flight at most: while one is held, every other request is shed.
  stack = await startStack({ agentsPerRegion: 1, agent: { maxInFlight: 1 } });
  await stack.putPolicy('shed-writes', { capacity: 1000, refillPerSecond: 100 });
  await stack.ready(['shed-writes']);
}, 60_000);
afterAll(async () => {
  await stack?.[Symbol.asyncDispose]();
});

async function regions() {
  return RegionsResponse.parse(await (await stack.admin('GET', '/v1/regions')).json()).regions;
}

describe('shed decisions reach the coordinator', () => {
  it('counts what eu shed, reports it as a rate for eu only, and returns to zero when the burst is over', async () => {
    const eu = stack.inRegion('eu')[0]!;
    // One decision is held in flight: its headers are sent (admission takes it at once), its body is not yet.
    // Every request that comes while it is held is shed, however fast the machine answers.
    const body = JSON.stringify({ policy: 'shed-writes', subject: 's-held' });
    const held = request(`${eu.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    });
    const heldAnswer = new Promise<number>((resolve, reject) => {
      held.on('response', (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      held.on('error', reject);
    });
    held.flushHeaders();
    await eventually(
      async () =>
        /^quotaplane_in_flight_decisions(?:\{[^}]*\})? 1$/m.test(
          await (await fetch(`${eu.url}/metrics`)).text(),
        ),
      5000,
      'the held decision is in flight',
    );

    const answers = await Promise.all(
      Array.from({ length: 199 }, (_, i) =>
        decide(eu.url, { policy: 'shed-writes', subject: `s-${i % 20}` }),
      ),
    );
    expect(answers.filter((a) => a.status === 503 && a.body.code === 'AGT_ERR_OVERLOADED')).toHaveLength(199);
    held.end(body);
    expect(await heldAnswer).toBe(200);

    // The next heartbeat carries them: eu's rate is positive, the quiet regions' zero.
    let seen: Awaited<ReturnType<typeof regions>> = [];
    await eventually(
      async () => {
        seen = await regions();
        return (seen.find((r) => r.region === 'eu')?.shedPerSecond ?? 0) > 0;
      },
      10_000,
      'eu reports shedding',
      50,
    );
    const byRegion = Object.fromEntries(seen.map((r) => [r.region, r]));
    expect(byRegion['eu']!.shedPerSecond).toBeGreaterThan(0);
    expect(byRegion['eu']!.agentDetails![0]!.shedPerSecond).toBe(byRegion['eu']!.shedPerSecond);
    expect(byRegion['us']!.shedPerSecond).toBe(0);
    expect(byRegion['ap']!.shedPerSecond).toBe(0);
    // Whole requests over a heartbeat interval: a clean number, at most three decimals.
    expect(String(byRegion['eu']!.shedPerSecond).split('.')[1]?.length ?? 0).toBeLessThanOrEqual(3);

    // With nothing shed since, a later heartbeat brings eu back to zero.
    await eventually(
      async () => (await regions()).find((r) => r.region === 'eu')!.shedPerSecond === 0,
      10_000,
      'eu reports no shedding after the burst',
      50,
    );
  });
});
