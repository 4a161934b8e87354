/**
 * The shared case table: every case runs against the reference model (core/models/token-bucket.ts) and against
 * `lua/token_bucket.lua` on a real Redis, and the two must return identical replies. Steps carry virtual time
 * (`at`, ms since the case began) so refills are exact on both sides; `expect` pins the numbers we promise.
 */

export interface CaseCheck {
  bucket: string;
  capacity: number;
  refillPerSecond: number;
  cost?: number;
  /** Default: one hour. */
  ttlMs?: number;
  /** Rate-history floor; `beforeMs` is virtual time like `at`. */
  floor?: { beforeMs: number; refillPerSecond: number; capacity: number };
  /** The bucket must already exist (subject-creation cap): missing, the request decides nothing. */
  mustExist?: boolean;
}

export interface CaseStep {
  /** Virtual ms since the case began; may be fractional (µs resolution) and may go backwards. */
  at: number;
  checks: CaseCheck[];
  dryRun?: boolean;
  idempotencyKey?: string;
  /** Most live idempotency records the subject keeps (default: the store's default). */
  maxRecords?: number;
  /** Repeat this step n times at the same instant (default 1); `expect` applies to the last. */
  repeat?: number;
  expect?:
    | {
        allowed?: boolean;
        replayed?: boolean;
        conflict?: boolean;
        remaining?: number[];
        retryAfterMs?: (number | null)[];
        resetMs?: (number | null)[];
        /** Indexes of mustExist buckets that were missing (default: none). */
        missing?: number[];
      }
    | undefined;
}

export interface BucketCase {
  name: string;
  steps: CaseStep[];
}

const b10 = { bucket: 'a', capacity: 10, refillPerSecond: 1 };

export const tokenBucketCases: BucketCase[] = [
  {
    name: 'a bucket that must exist and does not: nothing decided or written, its index answered',
    steps: [
      {
        at: 0,
        checks: [b10, { ...b10, bucket: 'new', mustExist: true }],
        expect: { allowed: false, missing: [1], remaining: [0, 0], retryAfterMs: [0, 0] },
      },
      // Nothing was charged or created: a is still full, and `new` is still missing.
      { at: 0, checks: [{ ...b10, mustExist: true }], expect: { allowed: false, missing: [0] } },
      // Created without the flag (the caller took a creation), then known: decided as usual.
      { at: 0, checks: [{ ...b10, bucket: 'new' }], expect: { allowed: true, remaining: [9] } },
      {
        at: 0,
        checks: [b10, { ...b10, bucket: 'new', mustExist: true }],
        expect: { allowed: true, missing: [], remaining: [9, 8] },
      },
    ],
  },
  {
    name: 'a dry run of a missing bucket that must exist answers missing too; a replay does not look',
    steps: [
      {
        at: 0,
        checks: [{ ...b10, mustExist: true }],
        dryRun: true,
        expect: { allowed: false, missing: [0] },
      },
      { at: 0, checks: [b10], idempotencyKey: 'm1', expect: { allowed: true, remaining: [9] } },
      {
        at: 0,
        checks: [b10],
        idempotencyKey: 'm1',
        expect: { allowed: true, replayed: true, remaining: [9] },
      },
    ],
  },
  {
    name: 'a new bucket starts full',
    steps: [
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [9], retryAfterMs: [0], resetMs: [1000] } },
    ],
  },
  {
    name: 'drains to zero then denies with retry-after of one refill',
    steps: [
      { at: 0, checks: [b10], repeat: 10, expect: { allowed: true, remaining: [0], resetMs: [10000] } },
      { at: 0, checks: [b10], expect: { allowed: false, remaining: [0], retryAfterMs: [1000] } },
    ],
  },
  {
    name: 'refills exactly at the boundary, not a microsecond before',
    steps: [
      { at: 0, checks: [{ ...b10, refillPerSecond: 2 }], repeat: 10 },
      {
        at: 499.999,
        checks: [{ ...b10, refillPerSecond: 2 }],
        expect: { allowed: false, retryAfterMs: [1] },
      },
      { at: 500, checks: [{ ...b10, refillPerSecond: 2 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'weighted costs admit exactly what fits',
    steps: [
      { at: 0, checks: [{ ...b10, cost: 4 }], expect: { allowed: true, remaining: [6] } },
      { at: 0, checks: [{ ...b10, cost: 4 }], expect: { allowed: true, remaining: [2] } },
      {
        at: 0,
        checks: [{ ...b10, cost: 4 }],
        expect: { allowed: false, remaining: [2], retryAfterMs: [2000] },
      },
      { at: 0, checks: [{ ...b10, cost: 2 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a cost equal to capacity fits a full bucket',
    steps: [
      { at: 0, checks: [{ ...b10, cost: 10 }], expect: { allowed: true, remaining: [0], resetMs: [10000] } },
    ],
  },
  {
    name: 'a cost above capacity never fits and says so',
    steps: [
      {
        at: 0,
        checks: [{ ...b10, cost: 11 }],
        expect: { allowed: false, remaining: [10], retryAfterMs: [null] },
      },
    ],
  },
  {
    name: 'a zero share admits nothing, ever',
    steps: [
      {
        at: 0,
        checks: [{ bucket: 'z', capacity: 0, refillPerSecond: 0 }],
        expect: { allowed: false, remaining: [0], retryAfterMs: [null], resetMs: [0] },
      },
    ],
  },
  {
    name: 'a clock step backwards refills nothing and does not rewind the bucket',
    steps: [
      { at: 1000, checks: [b10], repeat: 10 },
      { at: 500, checks: [b10], expect: { allowed: false, remaining: [0], retryAfterMs: [1000] } },
      { at: 1500, checks: [b10], expect: { allowed: false, retryAfterMs: [500] } },
      { at: 2000, checks: [b10], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a rate increase refills the elapsed interval at the old, lower rate',
    steps: [
      { at: 0, checks: [b10], repeat: 10 },
      { at: 1000, checks: [{ ...b10, refillPerSecond: 10 }], expect: { allowed: true, remaining: [0] } },
      { at: 1100, checks: [{ ...b10, refillPerSecond: 10 }], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a rate decrease refills the elapsed interval at the new, lower rate',
    steps: [
      { at: 0, checks: [{ ...b10, refillPerSecond: 10 }], repeat: 10 },
      { at: 1000, checks: [b10], expect: { allowed: true, remaining: [0] } },
    ],
  },
  {
    name: 'a capacity shrink clamps stored tokens',
    steps: [
      { at: 0, checks: [b10], expect: { remaining: [9] } },
      { at: 0, checks: [{ ...b10, capacity: 5 }], expect: { allowed: true, remaining: [4] } },
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [3] } },
    ],
  },
  {
    name: 'a capacity grow mints nothing',
    steps: [
      { at: 0, checks: [{ ...b10, capacity: 5 }], expect: { remaining: [4] } },
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [3], resetMs: [7000] } },
    ],
  },
  {
    name: 'after a capacity grow, the elapsed interval refills only up to the old capacity',
    steps: [
      { at: 0, checks: [b10], dryRun: false, expect: { remaining: [9] } },
      { at: 5000, checks: [{ ...b10, capacity: 20 }], expect: { allowed: true, remaining: [9] } },
      {
        at: 6000,
        checks: [{ ...b10, capacity: 20 }],
        expect: { allowed: true, remaining: [9], resetMs: [11000] },
      },
    ],
  },
  {
    name: 'layered checks are all-or-nothing: a denial on one bucket charges none',
    steps: [
      { at: 0, checks: [{ bucket: 'user', capacity: 1, refillPerSecond: 1 }] },
      {
        at: 0,
        checks: [b10, { bucket: 'user', capacity: 1, refillPerSecond: 1 }],
        expect: { allowed: false, remaining: [10, 0], retryAfterMs: [0, 1000] },
      },
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [9] } },
    ],
  },
  {
    name: 'layered checks that all fit charge all',
    steps: [
      {
        at: 0,
        checks: [b10, { bucket: 'user', capacity: 3, refillPerSecond: 1, cost: 2 }],
        expect: { allowed: true, remaining: [9, 1] },
      },
    ],
  },
  {
    name: 'a dry run reports the decision and charges nothing',
    steps: [
      { at: 0, checks: [b10], dryRun: true, expect: { allowed: true, remaining: [9] } },
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [9] } },
      {
        at: 0,
        checks: [{ ...b10, cost: 20 }],
        dryRun: true,
        expect: { allowed: false, retryAfterMs: [null] },
      },
    ],
  },
  {
    name: 'an idempotency key replays the first decision and charges once',
    steps: [
      {
        at: 0,
        checks: [{ ...b10, cost: 3 }],
        idempotencyKey: 'k1',
        expect: { allowed: true, replayed: false, remaining: [7] },
      },
      {
        at: 0,
        checks: [{ ...b10, cost: 3 }],
        idempotencyKey: 'k1',
        expect: { allowed: true, replayed: true, remaining: [7] },
      },
      { at: 0, checks: [b10], expect: { allowed: true, remaining: [6] } },
    ],
  },
  {
    name: 'a refusal is not remembered: a retry with the same key after Retry-After is decided afresh',
    steps: [
      { at: 0, checks: [{ ...b10, cost: 10 }], expect: { allowed: true, remaining: [0] } },
      {
        at: 0,
        checks: [{ ...b10, cost: 5 }],
        idempotencyKey: 'k2',
        expect: { allowed: false, replayed: false, retryAfterMs: [5000] },
      },
      {
        at: 6000,
        checks: [{ ...b10, cost: 5 }],
        idempotencyKey: 'k2',
        expect: { allowed: true, replayed: false, remaining: [1] },
      },
      {
        at: 6000,
        checks: [{ ...b10, cost: 5 }],
        idempotencyKey: 'k2',
        expect: { allowed: true, replayed: true, remaining: [1] },
      },
      {
        at: 6000,
        checks: [{ ...b10, cost: 5 }],
        expect: { allowed: false, remaining: [1], retryAfterMs: [4000] },
      },
    ],
  },
  {
    name: 'an idempotency key reused for another request is a conflict: nothing decided or charged',
    steps: [
      { at: 0, checks: [b10], idempotencyKey: 'k4', expect: { allowed: true, remaining: [9] } },
      {
        at: 0,
        checks: [{ ...b10, cost: 2 }],
        idempotencyKey: 'k4',
        expect: { allowed: false, replayed: false, conflict: true, remaining: [0] },
      },
      {
        at: 0,
        checks: [b10, { ...b10, bucket: 'other' }],
        idempotencyKey: 'k4',
        expect: { allowed: false, conflict: true },
      },
      {
        at: 0,
        checks: [b10],
        idempotencyKey: 'k4',
        expect: { allowed: true, replayed: true, conflict: false, remaining: [9] },
      },
      { at: 0, checks: [b10], expect: { remaining: [8] } },
    ],
  },
  {
    name: 'a subject keeps at most maxRecords idempotency records: the one closest to expiry goes first',
    steps: [
      { at: 0, checks: [b10], idempotencyKey: 'ka', maxRecords: 2, expect: { remaining: [9] } },
      { at: 1000, checks: [b10], idempotencyKey: 'kb', maxRecords: 2, expect: { remaining: [9] } },
      { at: 2000, checks: [b10], idempotencyKey: 'kc', maxRecords: 2, expect: { remaining: [9] } },
      {
        at: 2000,
        checks: [b10],
        idempotencyKey: 'kc',
        maxRecords: 2,
        expect: { allowed: true, replayed: true, remaining: [9] },
      },
      {
        at: 2000,
        checks: [b10],
        idempotencyKey: 'kb',
        maxRecords: 2,
        expect: { allowed: true, replayed: true, remaining: [9] },
      },
      // ka's record was deleted for kc's: its retry is decided afresh and charged.
      {
        at: 2000,
        checks: [b10],
        idempotencyKey: 'ka',
        maxRecords: 2,
        expect: { allowed: true, replayed: false, remaining: [8] },
      },
    ],
  },
  {
    name: 'a dry run with an idempotency key records nothing',
    steps: [
      {
        at: 0,
        checks: [b10],
        idempotencyKey: 'k3',
        dryRun: true,
        expect: { allowed: true, replayed: false, remaining: [9] },
      },
      {
        at: 0,
        checks: [b10],
        idempotencyKey: 'k3',
        expect: { allowed: true, replayed: false, remaining: [9] },
      },
    ],
  },
  {
    name: 'the rate floor refills an old bucket at the lowest rate since',
    steps: [
      { at: 0, checks: [{ ...b10, refillPerSecond: 10 }], repeat: 10 },
      {
        at: 1000,
        checks: [{ ...b10, refillPerSecond: 10, floor: { beforeMs: 500, refillPerSecond: 1, capacity: 10 } }],
        expect: { allowed: true, remaining: [0] },
      },
    ],
  },
  {
    name: 'the capacity floor clamps an old bucket before it refills',
    steps: [
      { at: 0, checks: [b10], expect: { remaining: [9] } },
      {
        at: 1000,
        checks: [{ ...b10, floor: { beforeMs: 500, refillPerSecond: 1, capacity: 2 } }],
        expect: { allowed: true, remaining: [2] },
      },
    ],
  },
  {
    name: 'the floor ignores buckets written after it',
    steps: [
      { at: 0, checks: [{ ...b10, refillPerSecond: 10 }], repeat: 10 },
      {
        at: 1000,
        checks: [{ ...b10, refillPerSecond: 10, floor: { beforeMs: -1, refillPerSecond: 1, capacity: 1 } }],
        expect: { allowed: true, remaining: [9] },
      },
    ],
  },
  {
    // Seed 31 of the conservation property suite: a region whose share rose started new buckets full at the new
    // share while the region that gave it up had spent its tokens. A missing bucket counts as written at time 0.
    name: 'a missing bucket starts at the floor capacity; one without a floor starts full',
    steps: [
      {
        at: 0,
        checks: [
          { ...b10, floor: { beforeMs: -1, refillPerSecond: 1, capacity: 3 } },
          { ...b10, bucket: 'b' },
        ],
        expect: { allowed: true, remaining: [2, 9] },
      },
    ],
  },
  {
    name: 'fractions of a micro-token carry over between frequent calls',
    steps: [
      { at: 0, checks: [{ bucket: 'c', capacity: 1, refillPerSecond: 0.25 }] },
      {
        at: 0.001,
        checks: [{ bucket: 'c', capacity: 1, refillPerSecond: 0.25 }],
        expect: { allowed: false, remaining: [0] },
      },
      {
        at: 0.002,
        checks: [{ bucket: 'c', capacity: 1, refillPerSecond: 0.25 }],
        expect: { allowed: false, remaining: [0] },
      },
      {
        at: 0.003,
        checks: [{ bucket: 'c', capacity: 1, refillPerSecond: 0.25 }],
        expect: { allowed: false, remaining: [0] },
      },
      {
        at: 0.004,
        checks: [{ bucket: 'c', capacity: 1, refillPerSecond: 0.25 }],
        expect: { allowed: false, remaining: [0.000001] },
      },
    ],
  },
  {
    name: 'decimal rates reach whole tokens exactly after repeated refills',
    steps: [
      { at: 0, checks: [{ bucket: 'd', capacity: 1, refillPerSecond: 0.1 }] },
      ...Array.from({ length: 9 }, (_, i) => ({
        at: (i + 1) * 1000,
        checks: [{ bucket: 'd', capacity: 1, refillPerSecond: 0.1 }],
        expect: { allowed: false },
      })),
      {
        at: 10_000,
        checks: [{ bucket: 'd', capacity: 1, refillPerSecond: 0.1 }],
        expect: { allowed: true, remaining: [0] },
      },
    ],
  },
  {
    name: 'retry-after is rounded up so a retry at that time succeeds',
    steps: [
      { at: 0, checks: [{ bucket: 'r', capacity: 1, refillPerSecond: 3 }] },
      {
        at: 0,
        checks: [{ bucket: 'r', capacity: 1, refillPerSecond: 3 }],
        expect: { allowed: false, retryAfterMs: [334] },
      },
      {
        at: 333,
        checks: [{ bucket: 'r', capacity: 1, refillPerSecond: 3 }],
        expect: { allowed: false, retryAfterMs: [1] },
      },
      { at: 334, checks: [{ bucket: 'r', capacity: 1, refillPerSecond: 3 }], expect: { allowed: true } },
    ],
  },
  {
    name: 'fractional capacities from regional shares',
    steps: [
      {
        at: 0,
        checks: [{ bucket: 's', capacity: 100 * 0.35, refillPerSecond: 2 * 0.35, cost: 35 }],
        expect: { allowed: true, remaining: [0] },
      },
      {
        at: 0,
        checks: [{ bucket: 's', capacity: 100 * 0.35, refillPerSecond: 2 * 0.35 }],
        expect: { allowed: false, retryAfterMs: [1429] },
      },
    ],
  },
];
