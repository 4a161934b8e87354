/**
 * A sharded token bucket under borrowing (issue 25): a short shard check must never borrow. A loan names the
 * subject and policy, and a lender takes from the subject's whole bucket, a key no sharded decision uses, which
 * reads as full: each borrow would mint up to C·s. Three regions on the models (test/helpers/model-world.ts).
 */
import { describe, expect, it } from 'vitest';
import { acceptLoan } from '../../../../core/borrowing/lender.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { ModelWorld } from '../../../helpers/model-world.js';

const sharded = parsePolicy({ name: 'hot', capacity: 40, refillPerSecond: 0.01, shards: 4 });

/** 6 rounds × 3 regions × 40 concurrent requests of one subject, 1 s apart; the admitted count. */
async function hammer(world: ModelWorld): Promise<number> {
  let admitted = 0;
  for (let round = 0; round < 6; round++) {
    const calls = ['us', 'eu', 'ap'].flatMap((region) =>
      Array.from({ length: 40 }, () => world.decide(region, { policy: 'hot', subject: 'all' })),
    );
    for (const outcome of await Promise.all(calls)) if ('allowed' in outcome && outcome.allowed) admitted++;
    world.clock.advance(1000);
  }
  return admitted;
}

describe('a sharded policy with borrowing on', () => {
  it('admits at most its global budget of 40 from three regions (was 76 and 69)', async () => {
    let n = 0;
    const world = new ModelWorld({
      policies: [sharded],
      borrowing: true,
      random: () => (n = (n + 0.37) % 1),
    });
    try {
      // 6 s at 0.01/s adds 0.06 tokens: 40 whole tokens at most.
      expect(await hammer(world)).toBeLessThanOrEqual(40);
    } finally {
      world.close();
    }
  });

  it('a shard refused for lack of tokens says shard_exhausted, and a lender refuses a sharded loan', async () => {
    const world = new ModelWorld({ policies: [sharded], borrowing: true, random: () => 0 });
    try {
      for (let i = 0; i < 3; i++) await world.decide('us', { policy: 'hot', subject: 'all' });
      const refused = await world.decide('us', { policy: 'hot', subject: 'all' });
      expect(refused).toMatchObject({ allowed: false, results: [{ reason: 'shard_exhausted' }] });
      const request = {
        fromRegion: 'us',
        policy: 'hot',
        version: 1,
        subject: 'all',
        mode: 'fill',
        amountMicros: 1_000_000,
        deadlineAtMs: world.clock.now() + 500,
        budgetMs: 500,
      };
      expect(acceptLoan(request as never, sharded, world.clock.now())).toMatchObject({
        error: 'not_regional',
      });
    } finally {
      world.close();
    }
  });
});
