/**
 * The multi-region acceptance on regions a WAN apart (test/helpers/geo-topology.ts: us-eu 70 ms, us-ap 150 ms,
 * eu-ap 220 ms round trip, ±10 % jitter), with the agents' default deadlines: strict checks from every region at
 * once, tenants homed in each region (the farthest included) getting their global budget through loans, and a
 * partition of the farthest region.
 *
 * Lease timing is the default's, scaled by a third (lease 2 s, grace 4 s, report 1/3 s, skew 1/3 s, where the
 * default is 6 s, 12 s, 1 s, 1 s), so the partition below, 20 s, is the issue's 60 s in lease lengths (10) and
 * grace periods (5): it runs through expiry, grace and the safe share, and far past them. In round trips the
 * scaled lease is harsher than the default: 9 of the longest round trip instead of 27 (docs/protocol.md,
 * "Timings at a distance"), so what holds here holds with the defaults.
 */
import { availableParallelism, loadavg } from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGeoTopology, type GeoTopology } from '../../../helpers/geo-topology.js';
import { decide, MultiRegion } from '../../../helpers/multi-region.js';
import { eventually } from '../../../helpers/wait.js';

const LEASE = { leaseMs: 2000, graceMs: 4000, skewMs: 333, reportIntervalMs: 333 };
/** The partition: 10 lease lengths, as 60 s is with the default 6 s lease. */
const PARTITION_MS = 10 * LEASE.leaseMs;
/** Recovery after the heal, stated: routes back (a second or two), then one lease renewal and a report. */
const RECOVERY_MS = 15_000;

type Answer = Awaited<ReturnType<typeof decide>>;

/**
 * The sheds among `answers` by path (the 503's `shed`) and the region of the agent asked, with each path's
 * first words: `answers[i]` was asked of `regionOf(i)`.
 */
function shedBreakdown(answers: Answer[], regionOf: (i: number) => string): string {
  const counts = new Map<string, number>();
  const words = new Map<string, string>();
  answers.forEach((a, i) => {
    if (a.status !== 503 || a.body.code !== 'AGT_ERR_OVERLOADED') return;
    const key = `${a.body.shed ?? 'unnamed'} from ${regionOf(i)}`;
    counts.set(key, (counts.get(key) ?? 0) + 1);
    if (!words.has(key)) words.set(key, a.body.detail ?? '');
  });
  return [...counts]
    .sort()
    .map(([key, n]) => `${n} ${key} (${words.get(key)})`)
    .join('; ');
}

function reasons(answers: Answer[]): Record<string, number> {
  const out = new Map<string, number>();
  for (const a of answers) {
    const key =
      a.status !== 200
        ? `${a.status} ${a.body.code ?? ''}`
        : a.body.allowed === true
          ? 'allowed'
          : (a.body.results?.[0]?.reason ?? 'denied');
    out.set(key, (out.get(key) ?? 0) + 1);
  }
  return Object.fromEntries([...out].sort());
}

describe('multi-region acceptance on the geo topology', () => {
  let geo: GeoTopology;
  let stack: MultiRegion;

  beforeAll(async () => {
    geo = await startGeoTopology();
    await geo.formed(30_000);
    stack = await new MultiRegion({
      geo,
      agentsPerRegion: 2,
      lease: LEASE,
    }).start();
  }, 90_000);

  /** Wait until every agent holds a leased share of `policy` (a new policy's first decisions are `no_lease`). */
  const leased = (policy: string) =>
    eventually(
      () =>
        stack.agents.every(
          (a) => (a.running.coordination!.holder.lease.shareFor(policy, 'x')?.share ?? 0) > 0,
        ),
      15_000,
      `every agent leased a share of ${policy}`,
      50,
    );

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
    await geo?.[Symbol.asyncDispose]();
  });

  it('600 concurrent strict checks over the three regions admit exactly 100, none unreachable, none shed when idle', async () => {
    // Homed in ap, the farthest region: us forwards across 150 ms, eu across 220 ms.
    await stack.putPolicy('geo-strict', {
      mode: 'strict',
      homeRegion: 'ap',
      capacity: 100,
      refillPerSecond: 100 / 86_400,
      idleTtlSeconds: 86_400,
    });
    await stack.putPolicy('geo-warm', { mode: 'strict', homeRegion: 'ap', capacity: 10, refillPerSecond: 1 });
    await stack.ready(['geo-strict', 'geo-warm']);
    // A deployment's agents have answered before a burst comes: one check from each region first, so the burst
    // does not meet a cold home (its first script loads, its first forwarded request compiled) on a busy CI box,
    // then a small concurrent burst of the same path (forwarded batches, the home's batched script call), which a
    // freshly started stack had not yet run: in two CI runs straight after the integration suite the home shed 4
    // and 24 of the 600 (taken up too late), and none in runs of this file alone.
    for (const a of stack.agents)
      expect((await decide(a.url, { policy: 'geo-warm', subject: 'w' })).status).toBe(200);
    const warm = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        decide(stack.agents[i % stack.agents.length]!.url, { policy: 'geo-warm', subject: `w${i % 6}` }),
      ),
    );
    // Warming, not measured: an answer each, a decision or an explicit shed.
    for (const w of warm) expect([200, 503], JSON.stringify(w)).toContain(w.status);
    // The test process runs all six agents: its event loop's delay during the burst is every agent's queueing.
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();
    const answers = await Promise.all(
      Array.from({ length: 600 }, (_, i) =>
        decide(stack.agents[i % stack.agents.length]!.url, { policy: 'geo-strict', subject: 'acct-1' }),
      ),
    );
    loop.disable();
    const seen = reasons(answers);
    const shed = seen['503 AGT_ERR_OVERLOADED'] ?? 0;
    // Every shed reported, by path and the region asked, before the counts are checked.
    if (shed > 0 || seen.allowed !== 100) {
      console.warn(
        `geo acceptance: ${shed} of 600 shed at load ${loadavg()[0]!.toFixed(1)}, event-loop delay p99 ` +
          `${(loop.percentile(99) / 1e6).toFixed(0)} ms, max ${(loop.max / 1e6).toFixed(0)} ms: ` +
          shedBreakdown(answers, (i) => stack.agents[i % stack.agents.length]!.region),
      );
    }
    // Exactly the bucket, and every other answer the bucket's refusal or, on a machine too busy to answer in
    // time, an explicit shed (charging nothing); never home_unreachable.
    expect(seen, JSON.stringify(seen)).toEqual({
      allowed: 100,
      subject_exhausted: 500 - shed,
      ...(shed > 0 ? { '503 AGT_ERR_OVERLOADED': shed } : {}),
    });
    // Issue 26 asks that an idle machine shed none. In four clean-clone CI runs on 2026-12-05 the home shed 4, 2
    // and 24 of the 600 ("taken up too late"). The cause (docs/protocol.md, "Timings at a distance"): the six
    // agents and this file's 600 fetches share one event loop, which stalls 150-450 ms in the burst (its new
    // connections); the forwarder held its batch for the end of that turn, and the home, on the same loop, takes
    // forwarded checks up only after it. The forwarder now sends at once (at load 7-8: 0, 0, 20, 20 shed where
    // the turn's end gave 32-39 in the same minutes; at load 3-6 none in 10 of 12 runs). Since then none shed in
    // 7 of 7 runs on the idle machine (3 of this case alone, 4 in clean-clone CI straight after the integration
    // suite, 2026-12-06), so an idle machine (load no higher than its cores) must shed none; a loaded one is only
    // reported, every shed by path.
    if (loadavg()[0]! <= availableParallelism()) expect(shed, JSON.stringify(seen)).toBe(0);
  }, 60_000);

  it('a tenant homed in each region, the farthest included, gets at least 0.95 of its global budget', async () => {
    // Regional (shares of a third each), 60 tokens with next to no refill; each tenant calls its own region's
    // agent only, 10 a second, and borrows the rest of its budget from the other two regions' buckets.
    await stack.putPolicy('geo-tenants', {
      capacity: 60,
      refillPerSecond: 60 / 86_400,
      idleTtlSeconds: 86_400,
    });
    await stack.ready(['geo-tenants']);
    await leased('geo-tenants');
    const admitted = new Map<string, number>();
    const all: Answer[] = [];
    await Promise.all(
      stack.regions.map(async (region) => {
        const agent = stack.inRegion(region)[0]!;
        for (let i = 0; i < 70; i++) {
          const a = await decide(agent.url, { policy: 'geo-tenants', subject: `tenant-${region}` });
          all.push(a);
          if (a.body.allowed === true) admitted.set(region, (admitted.get(region) ?? 0) + 1);
          await new Promise((r) => setTimeout(r, 100));
        }
      }),
    );
    expect(all.every((a) => a.status === 200)).toBe(true);
    for (const region of stack.regions) {
      const got = admitted.get(region) ?? 0;
      expect(got, `tenant-${region}: ${got} of 60; ${JSON.stringify(reasons(all))}`).toBeGreaterThanOrEqual(
        Math.ceil(0.95 * 60),
      );
      // Never beyond the global budget: loans move tokens, they do not mint them.
      expect(got).toBeLessThanOrEqual(60);
    }
  }, 60_000);

  it('a partition of ap keeps the shares in force at most 1, answers truthfully, and recovers', async () => {
    await stack.putPolicy('geo-regional', { capacity: 300, refillPerSecond: 30, idleTtlSeconds: 3600 });
    await stack.putPolicy('geo-home-us', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 1_000_000,
      refillPerSecond: 1000,
    });
    await stack.ready(['geo-regional', 'geo-home-us']);
    await leased('geo-regional');
    const ap = stack.inRegion('ap')[0]!;
    // A region's agents share its Redis bucket: the region enforces the largest share any of them holds.
    const sumOfShares = (): number =>
      stack.regions.reduce(
        (s, r) =>
          s +
          Math.max(
            ...stack
              .inRegion(r)
              .map((a) => a.running.coordination!.holder.lease.shareFor('geo-regional', 'x')?.share ?? 0),
          ),
        0,
      );
    const worst = { sum: 0 };
    const watch = setInterval(() => (worst.sum = Math.max(worst.sum, sumOfShares())), 50);
    try {
      await geo.partition('ap');
      const started = Date.now();
      const during: Answer[] = [];
      const strictDuring: Answer[] = [];
      while (Date.now() - started < PARTITION_MS) {
        const [regional, strict] = await Promise.all([
          decide(ap.url, { policy: 'geo-regional', subject: `p-${during.length % 5}` }),
          decide(ap.url, { policy: 'geo-home-us', subject: 'acct-9' }),
        ]);
        during.push(regional);
        strictDuring.push(strict);
        await new Promise((r) => setTimeout(r, 250));
      }
      // Truthful: ap's own region decides regional checks within the share it may use (allowed, or refused as
      // the share's or the subject's); a strict check homed across the cut is the failure mode's, said so.
      expect(during.every((a) => a.status === 200)).toBe(true);
      const regionalSeen = reasons(during);
      expect(
        Object.keys(regionalSeen).every((k) =>
          // store_unavailable is ap's own Redis missing the production 50 ms store timeout, true too: seen once
          // on the containers backend at load 10. The defaults stay: they are what this file shows to hold at a
          // distance (a longer store timeout leaves a borrow less time for its lenders: 2 × it is kept back).
          ['allowed', 'share_exhausted', 'subject_exhausted', 'store_unavailable'].includes(k),
        ),
        JSON.stringify(regionalSeen),
      ).toBe(true);
      expect(reasons(strictDuring)).toEqual({ home_unreachable: strictDuring.length });
      await geo.heal('ap');
      const healed = Date.now();
      await eventually(
        async () =>
          (await decide(ap.url, { policy: 'geo-home-us', subject: 'acct-9' })).body.allowed === true,
        RECOVERY_MS,
        'a strict check from ap admitted by its home again',
        200,
      );
      await eventually(
        () => stack.inRegion('ap').every((a) => a.running.coordination!.holder.lease.mode() === 'valid'),
        Math.max(1, RECOVERY_MS - (Date.now() - healed)),
        "ap's agents holding valid leases again",
        100,
      );
    } finally {
      clearInterval(watch);
      await geo.heal('ap').catch(() => undefined);
    }
    expect(worst.sum).toBeLessThanOrEqual(1 + 1e-9);
  }, 90_000);
});
