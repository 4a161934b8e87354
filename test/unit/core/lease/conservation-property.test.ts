/**
 * The conservation property suite, unit tier (issue 25; docs/design.md "Conservation property suite"): generated
 * policies over the feature space and generated traffic across three regions, with share moves, agent restarts,
 * loan races, store freezes and NATS cuts, on the agent's decision path over the models with one manual clock
 * (test/helpers/model-world.ts). The global checker asserts that for every policy, subject and class, admissions
 * stay within the kind's bound over every window and day (test/helpers/conservation-cases.ts).
 *
 * `QP_PROPERTY_RUNS` sets the number of generated cases (default 2,000: about 6 s of test time on this project's
 * two-core machine at a load average of 7, 8 s before policies were parsed once per case and refusals lost their
 * stack traces; 300 cases took 11 s at a load of 19); `QP_PROPERTY_SEED` picks the run (default a fixed
 * seed). The cases that found real bugs are kept below as named cases, as literal inputs (a seed only replays with
 * the generator that drew it).
 *
 * Terms (direct decisions, `arbitraryCase(…, { terms: true })`) are left to the integration tier: what keeps them
 * safe is the lease protocol around them (a term held in the share view until it ran out, so a shrink is
 * acknowledged late; terms only under a valid lease; a restarted agent's first heartbeat only once its
 * predecessor's recorded terms have run out; a closing agent waiting for its terms before its goodbye), and the models hold no lease: their shares
 * are the world's table, moved at once, with no acknowledgement, coordinator or instance name. A direct decision
 * itself is the agent's script on the agent's bucket, which the models already decide for every call; modelled
 * here, a term would only repeat those decisions and could not fail for any of the reasons above. Term cases are
 * not drawn here; a `direct` call would run as any other call, a `crash` restart (its lean unsent) as any other.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  answerLost,
  arbitraryCase,
  type Case,
  type Charge,
  conservationViolations,
  newRecord,
  policyOf,
  recordAnswer,
  type Region,
  REGIONS,
  seeded,
  unadmittedReplays,
} from '../../../helpers/conservation-cases.js';
import { runOnModels } from '../../../helpers/conservation-models.js';
import { ModelWorld } from '../../../helpers/model-world.js';

/** Run one case and answer every problem: what the run saw, and the checker's violations. */
async function problems(c: Case, seed: number): Promise<string[]> {
  // Generated bodies are often refused (a hostile class, a bad cost): each refusal is an agent error, whose stack
  // trace nothing here reads, and capturing it took a fourteenth of the suite's time. The errors and their codes
  // are made and checked as ever; a failure below still has its stack.
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  let record: Awaited<ReturnType<typeof runOnModels>>;
  try {
    record = await runOnModels(c, seed);
  } finally {
    Error.stackTraceLimit = limit;
  }
  return [
    ...record.problems,
    ...unadmittedReplays(record),
    ...conservationViolations(c.policies, record.charges),
  ];
}

const RUNS = Number(process.env['QP_PROPERTY_RUNS'] ?? 2000);
// A fixed seed by default, so CI runs the same cases every time; set QP_PROPERTY_SEED (and QP_PROPERTY_RUNS) to
// explore.
const SEED = process.env['QP_PROPERTY_SEED'] ?? '20261205';

const base = {
  shards: undefined,
  goldFactor: undefined,
  homeRegion: undefined,
  newSubjects: undefined,
  maxCost: 1,
};
const one = (policy: string, subject = 'a') => ({ policy, subject, cost: 1 });

/** Inputs that found real bugs (each fails on the code before its fix). */
const NAMED: Record<string, Case> = {
  // Seed -1823788755 (issue 25): a short shard borrowed for the whole subject; lenders lent from a phantom
  // full bucket. 7 admitted of 6. Fixed: sharded checks never borrow.
  'sharded policy with borrowing (shard bug)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 2,
        refillPerSecond: 0.1,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
      {
        ...base,
        name: 'p1',
        kind: 'token_bucket',
        capacity: 6,
        refillPerSecond: 0.1,
        shards: 2,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
    ],
    borrowing: true,
    steps: [
      {
        op: 'traffic',
        calls: [
          { regions: ['eu', 'us'], checks: [one('p1')], dryRun: false, repeat: 1 },
          { regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 1 },
        ],
        rounds: 4,
        gapMs: 0,
      },
    ],
  },
  // Issue 25, fixed on main by 447c542: "class": "constructor" found Object as its class, was sized NaN, and a
  // fail-open policy admitted it without charge (30 of 30 on a capacity of 10). It must be a 4xx.
  'class constructor on a fail-open policy (class bug)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 10,
        refillPerSecond: 0.1,
        goldFactor: 2,
        mode: 'regional',
        onStoreFailure: 'open',
      },
    ],
    borrowing: false,
    steps: [
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [{ ...one('p0'), class: 'constructor' }], dryRun: false, repeat: 30 },
        ],
        rounds: 1,
        gapMs: 0,
      },
    ],
  },
  // Seed -1293661078: two racing calls of one key; the second replayed the first's day-group grant and, denied by
  // a later group, refunded it too: the grant came back twice (7 admitted of 6 on a daily budget). Fixed: a group
  // answered from its record is not refunded (layered-runner.ts).
  'racing retries both denied by a later group (double refund)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 2,
        refillPerSecond: 0.1,
        shards: 2,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
      { ...base, name: 'p1', kind: 'daily', capacity: 2, mode: 'local', onStoreFailure: 'closed' },
    ],
    borrowing: true,
    steps: [
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p1')], dryRun: false, repeat: 1 },
          { regions: ['us'], checks: [one('p1'), one('p0')], idempotencyKey: 'k1', dryRun: false, repeat: 2 },
        ],
        rounds: 2,
        gapMs: 0,
      },
      ...[1, 2, 3].map(() => ({
        op: 'traffic' as const,
        calls: [{ regions: ['us' as const], checks: [one('p1')], dryRun: false, repeat: 1 }],
        rounds: 1,
        gapMs: 0,
      })),
    ],
  },
  // Seed 2031207599: a one-group request and a layered one shared a key; the layered request's group of the same
  // checks replayed the other request's record and was admitted without charge (4 admitted of 3). Fixed: a new
  // claim with a replayed local group is a conflict (layered-runner.ts).
  'one key on a single and a layered request (replay of another request)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 3,
        refillPerSecond: 0.1,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
      {
        ...base,
        name: 'p1',
        kind: 'concurrency',
        capacity: 3,
        windowSeconds: 1,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
    ],
    borrowing: true,
    steps: [
      {
        op: 'traffic',
        calls: [{ regions: ['us'], checks: [one('p0')], idempotencyKey: 'k2', dryRun: false, repeat: 1 }],
        rounds: 1,
        gapMs: 0,
      },
      {
        op: 'traffic',
        calls: [{ regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 2 }],
        rounds: 1,
        gapMs: 0,
      },
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p1'), one('p0')], idempotencyKey: 'k2', dryRun: false, repeat: 1 },
        ],
        rounds: 1,
        gapMs: 0,
      },
    ],
  },
  // The seed-31 fix's other direction, by hand: a layered request recorded its p0 group under the caller's plain
  // key, so a later one-group request of the same p0 check with that key replayed the layered request's record
  // without a charge (3 admitted of 2 before the fix). Every group of a layered request now records under the key
  // bound to the whole request (idempotency-claim.ts boundKey): the one-group request is decided, and charged.
  'one key on a layered and then a single request (replay of another request, reversed)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 2,
        refillPerSecond: 0.1,
        mode: 'local',
        onStoreFailure: 'closed',
      },
      { ...base, name: 'p1', kind: 'daily', capacity: 2, mode: 'local', onStoreFailure: 'closed' },
    ],
    borrowing: false,
    steps: [
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p0'), one('p1')], idempotencyKey: 'k2', dryRun: false, repeat: 1 },
        ],
        rounds: 1,
        gapMs: 0,
      },
      {
        op: 'traffic',
        calls: [{ regions: ['us'], checks: [one('p0')], idempotencyKey: 'k2', dryRun: false, repeat: 1 }],
        rounds: 1,
        gapMs: 0,
      },
      {
        op: 'traffic',
        calls: [{ regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 2 }],
        rounds: 1,
        gapMs: 0,
      },
    ],
  },
  // Seed 31 (QP_PROPERTY_RUNS=1500, case 742): 6 admitted in 3 s of C + R·W = 5.3, with or without borrowing.
  // A share move from a region that had spent its tokens (us, after bursting) to one where the subject's bucket
  // did not exist yet (eu) gave eu a new bucket full at its new share: the move minted C × the amount moved.
  // Fixed: a missing bucket starts at the lowest share the region held within the idle TTL (core/shares/share-sizing.ts,
  // lua/token_bucket.lua, lend.lua, grant.lua: a missing bucket counts as written before any floor).
  'a share move toward a region whose bucket did not exist (share-move mint)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 5,
        refillPerSecond: 0.1,
        mode: 'regional',
        onStoreFailure: 'closed',
      },
    ],
    borrowing: true,
    steps: [
      { op: 'move', policy: 'p0', from: 'eu', to: 'us', amount: 0.1 },
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 2 },
          { regions: ['us'], checks: [one('p0')], idempotencyKey: 'k1', dryRun: false, repeat: 1 },
        ],
        rounds: 1,
        gapMs: 0,
      },
      { op: 'move', policy: 'p0', from: 'us', to: 'eu', amount: 1 / 3 },
      {
        op: 'traffic',
        calls: [{ regions: ['ap', 'eu'], checks: [one('p0')], dryRun: false, repeat: 2 }],
        rounds: 4,
        gapMs: 1000,
      },
      {
        op: 'traffic',
        calls: [{ regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 1 }],
        rounds: 1,
        gapMs: 0,
      },
    ],
  },
  // Seed 16 (QP_PROPERTY_RUNS=300): the same, across regions: a layered request from us whose strict check is
  // homed in ap sent the caller's key to ap, where a one-check request had used it for the same check; ap
  // replayed that record (3 admitted of 2). Fixed: a group of a several-group request goes to its home under a
  // key bound to the whole request (idempotency-claim.ts boundKey).
  'one key on a single and a layered request, forwarded to the home (replay of another request)': {
    policies: [
      {
        ...base,
        name: 'p0',
        kind: 'token_bucket',
        capacity: 2,
        refillPerSecond: 0.1,
        mode: 'strict',
        homeRegion: 'us',
        onStoreFailure: 'closed',
      },
      {
        ...base,
        name: 'p1',
        kind: 'token_bucket',
        capacity: 2,
        refillPerSecond: 0.1,
        mode: 'strict',
        homeRegion: 'ap',
        onStoreFailure: 'closed',
      },
    ],
    borrowing: false,
    steps: [
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p1')], dryRun: false, repeat: 1 },
          { regions: ['us'], checks: [one('p1')], idempotencyKey: 'k2', dryRun: false, repeat: 1 },
        ],
        rounds: 2,
        gapMs: 0,
      },
      {
        op: 'traffic',
        calls: [
          { regions: ['us'], checks: [one('p0'), one('p1')], idempotencyKey: 'k2', dryRun: false, repeat: 1 },
        ],
        rounds: 1,
        gapMs: 0,
      },
    ],
  },
};

// The replay check (`unadmittedReplays`) on recorded answers: a replay must repeat an admission of the same call
// where its checks are kept, or follow an answer that was lost (the real stack's timeouts and frozen Redis).
describe('the replay check', () => {
  const spec = {
    ...base,
    name: 'p0',
    kind: 'token_bucket' as const,
    capacity: 2,
    refillPerSecond: 0.1,
    mode: 'regional' as const,
    onStoreFailure: 'closed' as const,
  };
  const specs = new Map([['p0', spec]]);
  const call = {
    regions: ['us' as const],
    checks: [one('p0')],
    idempotencyKey: 'k',
    dryRun: false,
    repeat: 1,
  };
  const admitted = { allowed: true, results: [{ allowed: true }] };
  const replayed = { ...admitted, replayed: true };
  const flagged = [
    `a replay of a request never admitted: {"policy":"p0","subject":"a","cost":1,"idempotencyKey":"k"}`,
  ];

  function check(answers: [Parameters<typeof recordAnswer>[3], Region][]): string[] {
    const record = newRecord();
    answers.forEach(([answer, region], at) => recordAnswer(record, specs, call, answer, at, false, region));
    return unadmittedReplays(record);
  }

  it('flags a forged replay: a replay of a call never admitted anywhere', () => {
    expect(check([[replayed, 'us']])).toEqual(flagged);
  });

  it('passes a replay of an admitted call in the region that admitted it', () => {
    expect(
      check([
        [admitted, 'us'],
        [replayed, 'us'],
      ]),
    ).toEqual([]);
  });

  it('passes a replay after a lost answer (a timeout: the store may have admitted it)', () => {
    expect(
      check([
        [{ error: '503', lost: true }, 'us'],
        [replayed, 'us'],
      ]),
    ).toEqual([]);
    const timedOut = { allowed: false, results: [{ allowed: false }], lost: true };
    expect(
      check([
        [timedOut, 'us'],
        [replayed, 'us'],
      ]),
    ).toEqual([]);
  });

  it('still flags a replay after a definite refusal, or after a lost answer in another region', () => {
    expect(
      check([
        [{ error: 'AGT_ERR_IDEMPOTENCY_CONFLICT' }, 'us'],
        [replayed, 'us'],
      ]),
    ).toEqual(flagged);
    expect(
      check([
        [{ allowed: false, results: [{ allowed: false }] }, 'us'],
        [replayed, 'us'],
      ]),
    ).toEqual(flagged);
    expect(
      check([
        [{ error: '503', lost: true }, 'eu'],
        [replayed, 'us'],
      ]),
    ).toEqual(flagged);
    expect(
      check([
        [admitted, 'eu'],
        [replayed, 'us'],
      ]),
    ).toEqual(flagged);
  });

  it('reads a lost answer from the HTTP status and the degraded causes', () => {
    expect(answerLost(503, {})).toBe(true);
    expect(answerLost(429, {})).toBe(false);
    expect(answerLost(409, {})).toBe(false);
    expect(answerLost(200, { results: [{}, { cause: 'store_unavailable' }] })).toBe(true);
    expect(answerLost(200, { results: [{ cause: 'home_unreachable' }] })).toBe(true);
    expect(answerLost(200, { results: [{ cause: 'no_lease' }] })).toBe(false);
  });
});

describe('conservation over generated policies and traffic (models)', () => {
  for (const [name, c] of Object.entries(NAMED)) {
    it(`named case: ${name}`, async () => {
      expect(await problems(c, 1)).toEqual([]);
    });
  }

  // Named regression case (was an open finding, "grant-return mint"): `POST /v1/grants/return` carried no proof of
  // a grant and the agent kept no record of one, so any caller could hand back tokens it never took: a drained
  // bucket was refilled up to its capacity at once, 60 admitted in 0 s of C = 30. A return now names the grant id
  // its take recorded (lua/grant.lua); a forged id (well formed, never issued) and a return with no id credit
  // nothing, so 30 are admitted, the capacity.
  it('a grant return without a grant refills nothing (grant-return mint)', async () => {
    const spec = { ...base, name: 'p0', kind: 'token_bucket' as const, capacity: 30, refillPerSecond: 0.1 };
    const policies = [{ ...spec, mode: 'regional' as const, onStoreFailure: 'closed' as const }];
    const world = new ModelWorld({ policies: policies.map(policyOf), borrowing: false, random: seeded(1) });
    const charges: Charge[] = [];
    try {
      for (let pass = 0; pass < 2; pass++) {
        for (const region of REGIONS) {
          for (let i = 0; i < 10; i++) {
            const answer = await world.decide(region, { policy: 'p0', subject: 'a' });
            if (!('error' in answer) && answer.allowed) {
              const at = world.clock.now();
              charges.push({ policy: 'p0', subject: 'a', class: undefined, region, at, sentAt: at, cost: 1 });
            }
          }
          if (pass === 0) {
            const forged = await world.returnGrant(region, {
              policy: 'p0',
              subject: 'a',
              grant: 'AAAAAAAAAAAAAAAAAAAAAA',
              amount: 10,
            });
            expect(forged).toEqual({ error: 'AGT_ERR_UNKNOWN_GRANT' });
            const bare = await world.returnGrant(region, { policy: 'p0', subject: 'a', amount: 10 } as never);
            expect(bare).toEqual({ error: 'AGT_ERR_INVALID_GRANT' });
          }
        }
      }
    } finally {
      world.close();
    }
    expect(conservationViolations(policies, charges)).toEqual([]);
    expect(charges).toHaveLength(30);
  });

  // Seed 31 (QP_PROPERTY_RUNS=1500, case 1274): p0 local with a subject-creation cap, p1 daily. Round 1: key k2
  // on a single p0 check (admitted), again (replayed), and on a layered p0 + p1 request (a conflict: its p0 group
  // replayed the single request's record under a new claim). Round 2, the same three: the layered request's claim,
  // written by the conflicting try, now said "same", so its p0 group was answered from the single request's record
  // without a charge: 3 admitted of 2. The cap was incidental (the case fails the same without it). Fixed: every
  // group of a several-group request records under the key bound to the whole request (idempotency-claim.ts
  // boundKey), so no group ever replays a record of another request.
  it('a layered retry never replays a single request’s record on a capped policy (seed 31)', async () => {
    const c: Case = {
      policies: [
        {
          ...base,
          name: 'p0',
          kind: 'token_bucket',
          capacity: 2,
          refillPerSecond: 0.1,
          mode: 'local',
          onStoreFailure: 'closed',
          newSubjects: { perMinute: 1, flood: 'deny' },
        },
        { ...base, name: 'p1', kind: 'daily', capacity: 2, mode: 'local', onStoreFailure: 'closed' },
      ],
      borrowing: true,
      steps: [
        {
          op: 'traffic',
          calls: [
            { regions: ['us'], checks: [one('p0')], idempotencyKey: 'k2', dryRun: false, repeat: 2 },
            {
              regions: ['us'],
              checks: [one('p0'), one('p1')],
              idempotencyKey: 'k2',
              dryRun: false,
              repeat: 1,
            },
          ],
          rounds: 2,
          gapMs: 0,
        },
        { op: 'batch', calls: [{ regions: ['us'], checks: [one('p0')], dryRun: false, repeat: 1 }] },
      ],
    };
    expect(await problems(c, 0)).toEqual([]);
  });

  // Named case (mixed-key 409): a one-group and a several-group request with one idempotency key. Records bound to
  // the whole request made them two requests, each decided; the several-group request's claim now marks the
  // one-group request's record key, so whichever comes second, or loses the race, is a 409 and charges nothing.
  it('one key on a one-group and a several-group request: a 409 in either order and in a race', async () => {
    const policies = [
      { ...base, name: 'p0', kind: 'token_bucket' as const, capacity: 10, refillPerSecond: 0.1 },
      { ...base, name: 'p1', kind: 'daily' as const, capacity: 10 },
    ].map((p) => ({ ...p, mode: 'regional' as const, onStoreFailure: 'closed' as const }));
    const world = new ModelWorld({ policies: policies.map(policyOf), borrowing: false, random: seeded(1) });
    const single = (key: string, subject: string) => ({ ...one('p0', subject), idempotencyKey: key });
    const layered = (key: string, subject: string) => ({
      checks: [one('p0', subject), one('p1', subject)],
      idempotencyKey: key,
    });
    const outcome = (a: Awaited<ReturnType<ModelWorld['decide']>>) => ('error' in a ? a.error : a.allowed);
    const conflict = 'AGT_ERR_IDEMPOTENCY_CONFLICT';
    try {
      expect(outcome(await world.decide('us', single('k1', 'a')))).toBe(true);
      expect(outcome(await world.decide('us', layered('k1', 'a')))).toBe(conflict);
      expect(outcome(await world.decide('us', layered('k2', 'b')))).toBe(true);
      expect(outcome(await world.decide('us', single('k2', 'b')))).toBe(conflict);
      for (const [n, subject] of ['c', 'd', 'e', 'f'].entries()) {
        const calls = [layered(`r${n}`, subject), single(`r${n}`, subject)];
        if (n % 2 === 1) calls.reverse();
        const answers = await Promise.all(calls.map((body) => world.decide('us', body)));
        expect(answers.map(outcome).sort()).toEqual([conflict, true].sort());
      }
      // One charge of p0 per subject (a, b, each raced pair's winner), none twice: a look at cost 1 leaves the
      // region's share less 2.
      for (const subject of ['a', 'b', 'c', 'd', 'e', 'f']) {
        const look = await world.decide('us', { ...one('p0', subject), dryRun: true });
        if ('error' in look) throw new Error(look.error);
        expect(look.results[0]!.limit - look.results[0]!.remaining, subject).toBeCloseTo(2, 5);
      }
    } finally {
      world.close();
    }
  });

  it(`holds the bound of every kind for every subject, class, window and day (${RUNS} cases)`, async () => {
    await fc.assert(
      fc.asyncProperty(arbitraryCase(), fc.integer(), async (c, seed) => {
        expect(await problems(c, seed)).toEqual([]);
      }),
      { numRuns: RUNS, seed: Number(SEED) },
    );
  }, 300_000);
});
