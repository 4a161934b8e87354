/**
 * Borrowing on the real stack: three regions (one agent each, equal shares held still), real NATS and one Redis
 * per region. A subject whose traffic comes from one region gets its global budget there, by moving its own
 * tokens from the other regions' buckets; nothing is ever minted, so no window admits more than C + R·W.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeRequest } from '../../../../core/wire/bucket.js';
import { BucketModel } from '../../../../core/models/token-bucket.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

type Answer = Awaited<ReturnType<typeof decide>>;
const reasonOf = (a: Answer) => a.body.results?.[0]?.reason;
const admittedOf = (answers: Answer[]) => answers.filter((a) => a.body.allowed === true).length;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one global bucket of (capacity, refill) admits of requests of cost 1 at `times` (epoch ms). */
function idealAdmitted(capacity: number, refillPerSecond: number, times: number[]): number {
  const model = new BucketModel();
  const request = encodeRequest({
    checks: [{ key: 'ideal', capacity, refillPerSecond, cost: 1, ttlMs: 3_600_000 }],
  });
  return times.filter((t) => model.evaluate(request, Math.round(t * 1000)).allowed).length;
}

async function metric(url: string, name: string, labels: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}

describe('borrowing between regions (us, eu, ap; equal shares)', () => {
  let stack: ServiceStack;
  const url = (region: string) => stack.inRegion(region)[0]!.url;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      // Shares stay at their equal safe values for the whole file: with every region's floor at 0.25, no
      // target is ever 0.5 away from a third, which a rebalance must be to start.
      rebalance: { hysteresis: 0.5 },
      agent: { borrowing: true, decisionDeadlineMs: 1500, storeTimeoutMs: 400, borrowBackoffMs: 2000 },
    });
    await stack.putPolicy('still', { capacity: 60, refillPerSecond: 0.0001, minShare: 0.25 });
    await stack.putPolicy('race', { capacity: 100, refillPerSecond: 0.0001, minShare: 0.25 });
    await stack.putPolicy('homed', { capacity: 60, refillPerSecond: 1, minShare: 0.25 });
    await stack.putPolicy('tiered', {
      capacity: 6,
      refillPerSecond: 0.0001,
      minShare: 0.25,
      classes: { enterprise: { capacity: 60, refillPerSecond: 0.001 } },
      subjects: { 'big-tenant': 'enterprise' },
    });
    await stack.ready(['still', 'race', 'homed', 'tiered']);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  it('three tenants homed one per region at 4/s for 12 s each get ≥ 0.95 of what one global bucket admits', async () => {
    const regions = ['us', 'eu', 'ap'];
    const sent = new Map<string, number[]>(regions.map((r) => [r, []]));
    const got = new Map<string, number>(regions.map((r) => [r, 0]));
    const start = Date.now();
    const inflight: Promise<void>[] = [];
    for (let i = 0; i < 48; i++) {
      const due = start + i * 250;
      await sleep(Math.max(0, due - Date.now()));
      for (const region of regions) {
        sent.get(region)!.push(Date.now());
        inflight.push(
          decide(url(region), { policy: 'homed', subject: `tenant-${region}` }).then((a) => {
            if (a.body.allowed === true) got.set(region, got.get(region)! + 1);
          }),
        );
      }
    }
    await Promise.all(inflight);
    for (const region of regions) {
      const ideal = idealAdmitted(60, 1, sent.get(region)!);
      expect(ideal).toBe(48);
      expect(got.get(region)! / ideal, region).toBeGreaterThanOrEqual(0.95);
    }
  }, 30_000);

  it('a burst of 60 at once by one subject on us gets its whole global burst of 60, then subject_exhausted', async () => {
    // us holds 20 of the subject's 60; the refusals borrow the other 40 from eu and ap (a top-up takes what they
    // hold above half their burst, then a refusal's fill the rest), and the burst is decided again as tokens
    // arrive. No refill to speak of, so every token is a whole one and the count is exact.
    const answers = await Promise.all(
      Array.from({ length: 60 }, () => decide(url('us'), { policy: 'still', subject: 'campaign' })),
    );
    expect(admittedOf(answers)).toBe(60);
    const after = await decide(url('us'), { policy: 'still', subject: 'campaign' });
    expect(after.body.allowed).toBe(false);
    expect(reasonOf(after)).toBe('subject_exhausted');
  }, 30_000);

  it("a subject of a class borrows its class's burst: 60 of 60 at once on us, whether named by the policy or the check", async () => {
    // The lenders size the subject's bucket by its class (the loan names it), as us does: 20 + 40 borrowed.
    // Sized by the policy's own 6 instead, eu and ap would give 2 each of the 20 they hold.
    for (const check of [
      { policy: 'tiered', subject: 'big-tenant' },
      { policy: 'tiered', subject: 'named-tenant', class: 'enterprise' },
    ]) {
      const answers = await Promise.all(Array.from({ length: 60 }, () => decide(url('us'), check)));
      expect(admittedOf(answers), check.subject).toBe(60);
      const after = await decide(url('us'), check);
      expect(after.body.allowed).toBe(false);
      expect(reasonOf(after)).toBe('subject_exhausted');
    }
    // A subject of the policy's own limits: its 6, 2 of them at home.
    const small = await Promise.all(
      Array.from({ length: 10 }, () => decide(url('us'), { policy: 'tiered', subject: 'small-tenant' })),
    );
    expect(admittedOf(small)).toBe(6);
  }, 30_000);

  it('500 racing callers on one subject across the regions never admit more than the 100 of its burst', async () => {
    const regions = ['us', 'eu', 'ap'];
    const answers = await Promise.all(
      Array.from({ length: 500 }, (_, i) =>
        decide(url(regions[i % 3]!), { policy: 'race', subject: 'contended' }),
      ),
    );
    const admitted = admittedOf(answers);
    expect(admitted).toBeLessThanOrEqual(100);
    // Asking again until every region is dry: still never more than the burst. (Exactly 100 is not yet held:
    // a grant whose answer reaches a borrower that stopped waiting is lost, see docs/agent.md.)
    let more = 0;
    for (const region of regions) {
      for (;;) {
        const a = await decide(url(region), { policy: 'race', subject: 'contended' });
        if (a.body.allowed !== true) {
          expect(reasonOf(a)).toBe('subject_exhausted');
          break;
        }
        more++;
      }
    }
    expect(admitted + more).toBeLessThanOrEqual(100);
    expect(admitted + more).toBeGreaterThan(0);
    const dropped = await Promise.all(
      regions.map((r) => metric(url(r), 'quotaplane_borrow_tokens_dropped_total', 'policy="race"')),
    );
    expect(dropped).toEqual([0, 0, 0]);
  }, 30_000);
});
