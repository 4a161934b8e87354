/**
 * A policy's units change under load (docs/operations.md, "Changing a policy's units"): the coordinator bumps
 * its version, every region switches to the new keys at one instant of its own and never back, the old keys
 * are left to their TTL, and across the switch a subject is admitted at most the old version's budget plus the
 * new one's. Three regions × one agent on real NATS and Redis; callers in every region while the PUT lands.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { slidingLogKey } from '../../../core/models/sliding-log.js';
import { decide, startStack, type ServiceStack } from '../../helpers/fixture/index.js';
import { eventually } from '../../helpers/wait.js';

const POLICY = 'migrate';
/** v1: 30 events in any 10 minutes; each region holds a third, 10. */
const V1 = { kind: 'sliding_log', capacity: 30, windowSeconds: 600 } as const;
/** v2: a new window (a units change) and 60 events in it; a third is 20. */
const V2 = { kind: 'sliding_log', capacity: 60, windowSeconds: 300 } as const;
const LIMIT = { 1: 10, 2: 20 } as const;
const SUBJECTS = ['s-0', 's-1', 's-2', 's-3'];
const CALLERS_PER_REGION = 3;

interface Answer {
  region: string;
  subject: string;
  /** performance.now() when the request was sent and when its answer came back. */
  sent: number;
  received: number;
  allowed: boolean;
  /** The version the answer was decided on, read from its limit (10: v1, 20: v2). */
  version: 1 | 2 | undefined;
  limit: number | undefined;
  /** Why a refusal was refused (`share_exhausted` when the region's part of the window is full). */
  reason: string | undefined;
}

let stack: ServiceStack;

beforeAll(async () => {
  // Rounds a minute apart and a long grace: shares stay at their first thirds, so the limits name the version.
  stack = await startStack({
    agentsPerRegion: 1,
    rebalance: { roundMs: 60_000 },
    lease: { graceMs: 65_000 },
  });
  await stack.putPolicy(POLICY, V1);
  await stack.ready([POLICY]);
}, 60_000);
afterAll(async () => {
  await stack?.[Symbol.asyncDispose]();
});

describe('policy version migration under load', () => {
  it('switches every region to the new keys once, never back, and admits at most both budgets', async () => {
    const answers: Answer[] = [];
    let stop = false;
    const caller = async (region: string, url: string, n: number) => {
      for (let i = n; !stop; i++) {
        const subject = SUBJECTS[i % SUBJECTS.length]!;
        const sent = performance.now();
        const res = await decide(url, { policy: POLICY, subject });
        const received = performance.now();
        const r = (res.body as { results?: { limit?: number; reason?: string }[] }).results?.[0];
        const limit = r?.limit;
        const version = limit === LIMIT[1] ? 1 : limit === LIMIT[2] ? 2 : undefined;
        answers.push({
          region,
          subject,
          sent,
          received,
          allowed: res.body.allowed === true,
          version,
          limit,
          reason: r?.reason,
        });
      }
    };
    // An admitted decision with an idempotency key, before the switch: its retry after it must not be charged.
    const us = stack.inRegion('us')[0]!;
    const idem = { policy: POLICY, subject: 'retried', idempotencyKey: 'order-1' };
    const first = await decide(us.url, idem);
    expect(first.body.allowed).toBe(true);

    const traffic = stack.agents.flatMap((a) =>
      Array.from({ length: CALLERS_PER_REGION }, (_, n) => caller(a.region, a.url, n)),
    );
    // Every subject spends its v1 budget in every region while callers keep going: spent means refused because
    // the window is full, not for a slow store (a busy machine can time a decision out and fail it closed).
    const spent = (version: 1 | 2) => () =>
      stack.regions.every((region) =>
        SUBJECTS.every((subject) =>
          answers.some(
            (a) =>
              a.region === region &&
              a.subject === subject &&
              a.version === version &&
              !a.allowed &&
              (a.reason === 'share_exhausted' || a.reason === 'subject_exhausted'),
          ),
        ),
      );
    await eventually(spent(1), 10_000, 'v1 budgets spent everywhere');

    // The units change (the window), with traffic running; the operator sends no version.
    const put = await stack.admin('PUT', `/v1/policies/${POLICY}`, V2);
    expect(put.status).toBe(200);
    expect(await put.json()).toMatchObject({ version: 2, windowSeconds: 300, capacity: 60 });
    await eventually(spent(2), 10_000, 'v2 budgets spent everywhere');
    stop = true;
    await Promise.all(traffic);

    // Every answer was decided on exactly one version: its limit is v1's or v2's, nothing else.
    expect(answers.filter((a) => a.version === undefined).map((a) => a.limit)).toEqual([]);
    // No region decided on v1 once it had answered on v2: every request sent after its first v2 answer came
    // back was decided on v2.
    for (const region of stack.regions) {
      const mine = answers.filter((a) => a.region === region);
      const switched = Math.min(...mine.filter((a) => a.version === 2).map((a) => a.received));
      expect(mine.filter((a) => a.sent > switched && a.version === 1)).toEqual([]);
      expect(mine.some((a) => a.version === 1)).toBe(true);
    }
    // Per subject: exactly v1's budget on v1 (30, 10 per region) and v2's on v2 (60), 90 in all: the old keys
    // were not consulted again and the new ones started empty.
    for (const subject of SUBJECTS) {
      const admitted = (version: 1 | 2, region?: string) =>
        answers.filter(
          (a) =>
            a.allowed &&
            a.subject === subject &&
            a.version === version &&
            (region === undefined || a.region === region),
        ).length;
      expect(admitted(1)).toBe(V1.capacity);
      expect(admitted(2)).toBe(V2.capacity);
      for (const region of stack.regions) {
        expect([admitted(1, region), admitted(2, region)]).toEqual([LIMIT[1], LIMIT[2]]);
      }
    }

    // The retry of the decision admitted on v1 is not admitted again on v2: its record names the v1 keys, so
    // the agent refuses it as a conflict before charging anything (docs/operations.md says so).
    const retry = await decide(us.url, idem);
    expect(retry.status).toBe(409);
    expect(retry.body.code).toBe('AGT_ERR_IDEMPOTENCY_CONFLICT');

    // The old keys are left to their TTL (never deleted), the new ones hold the new version's counts.
    for (const region of stack.regions) {
      const redis = new Redis(stack.region(region).redis.url);
      try {
        const old = slidingLogKey(1, 's-0', POLICY);
        const now = slidingLogKey(2, 's-0', POLICY);
        expect(await redis.zcount(old, '(-inf', '+inf')).toBe(LIMIT[1]);
        const ttl = await redis.pttl(old);
        expect(ttl).toBeGreaterThan(0);
        expect(ttl).toBeLessThanOrEqual(V1.windowSeconds * 1000);
        expect(await redis.zcount(now, '(-inf', '+inf')).toBe(LIMIT[2]);
        const retried = region === 'us' ? 1 : 0;
        expect(await redis.zcount(slidingLogKey(1, 'retried', POLICY), '(-inf', '+inf')).toBe(retried);
        expect(await redis.zcount(slidingLogKey(2, 'retried', POLICY), '(-inf', '+inf')).toBe(0);
      } finally {
        redis.disconnect();
      }
    }

    // The bump is audited: who, from which version to which, and why.
    const audit = await stack.admin('GET', `/v1/audit?policy=${POLICY}&limit=1`);
    const [entry] = ((await audit.json()) as { entries: Record<string, unknown>[] }).entries;
    expect(entry).toMatchObject({
      action: 'replace',
      before: { version: 1, windowSeconds: 600 },
      after: { version: 2, windowSeconds: 300 },
      versionBump: { from: 1, to: 2, fields: ['windowSeconds'] },
    });
  }, 45_000);

  it('never lowers a version: an old body or one without version keeps it; past the cap a units change is refused', async () => {
    const read = async () => {
      const res = await stack.admin('GET', `/v1/policies/${POLICY}`);
      return { etag: res.headers.get('etag'), body: (await res.json()) as { version: number } };
    };
    const before = await read();
    expect(before.body.version).toBe(2);
    // The same units and budget without a version (so 1), or asking for 1: nothing written, still v2.
    for (const body of [V2, { ...V2, version: 1 }]) {
      const res = await stack.admin('PUT', `/v1/policies/${POLICY}`, body);
      expect(res.status).toBe(200);
      expect(await res.json()).toMatchObject({ version: 2 });
      expect((await read()).etag).toBe(before.etag);
    }
    // The operator raises it alone: allowed, and no bump recorded.
    const raised = await stack.admin('PUT', `/v1/policies/${POLICY}`, { ...V2, version: 1_000_000 });
    expect(await raised.json()).toMatchObject({ version: 1_000_000 });
    // A units change would need a version past the cap: refused, nothing changes.
    const refused = await stack.admin('PUT', `/v1/policies/${POLICY}`, { ...V2, windowSeconds: 60 });
    expect(refused.status).toBe(422);
    expect(await refused.json()).toMatchObject({ code: 'COORD_ERR_INVALID_POLICY' });
    expect((await read()).body).toMatchObject({ version: 1_000_000, windowSeconds: 300 });
  });
});
