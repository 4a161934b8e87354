/**
 * A sharded token bucket with borrowing on, on the real stack (issue 25): three regions (one agent, one Redis
 * each, real NATS), one subject called concurrently from all three. Before the fix a short shard borrowed with
 * the unsharded subject and the policy's full capacity, and lenders lent from a bucket no sharded decision uses
 * (read as full): 76 and 69 of a global budget of 40 were admitted. A sharded check now never borrows.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

describe('a sharded policy with borrowing on, three regions', () => {
  let stack: ServiceStack;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      rebalance: { hysteresis: 0.5 },
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 400 },
    });
    await stack.putPolicy('hot', { capacity: 40, refillPerSecond: 0.01, shards: 4, minShare: 0.25 });
    await stack.ready(['hot']);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  it('6 rounds × 3 regions × 40 concurrent requests admit at most 40, each refusal shard_exhausted', async () => {
    const started = Date.now();
    let admitted = 0;
    const reasons = new Set<string | undefined>();
    for (let round = 0; round < 6; round++) {
      const answers = await Promise.all(
        stack.regions.flatMap((region) =>
          Array.from({ length: 40 }, () =>
            decide(stack.inRegion(region)[0]!.url, { policy: 'hot', subject: 'all' }),
          ),
        ),
      );
      for (const a of answers) {
        expect(a.status).toBe(200);
        if (a.body.allowed === true) admitted++;
        else reasons.add(a.body.results?.[0]?.reason);
      }
    }
    // C + R·W: 40 + 0.01/s × the run's length (well under 100 s: no whole token more).
    expect(Date.now() - started).toBeLessThan(100_000);
    expect(admitted).toBeLessThanOrEqual(40);
    expect([...reasons]).toEqual(['shard_exhausted']);
  });
});
