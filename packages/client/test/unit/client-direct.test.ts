/**
 * Direct decisions' rules in the client, with a scripted agent and a scripted Redis (the integration suite runs
 * them against a real agent and a real redis-server): when a term is used and when it is not, what goes to the
 * agent and why, what a script call carries, what an answer says, and what a renewal reports.
 */
import { describe, expect, it, vi } from 'vitest';
import {
  DirectDecider,
  type DirectDecision,
  type DirectOptions,
  type DirectRedis,
} from '../../src/direct.js';
import { AgentClient } from '../../src/agent-client.js';
import { termKeyFingerprint, type TermRequest, type TermResponse } from '../../../../core/wire/term.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';

const SHA = 'a'.repeat(40);
const REFUND_SHA = 'c'.repeat(40);

function term(over: Partial<TermResponse> = {}): TermResponse {
  return {
    policy: 'writes',
    version: 3,
    epoch: 7,
    bucket: { capacity: 10, refillPerSecond: 0.5, ttlMs: 60_000 },
    limit: 10,
    window: 20,
    mode: 'regional',
    validForMs: 1000,
    deadlineMicros: 5_000_000,
    refusals: 'final',
    exclude: ['vip'],
    headers: { draft: 'draft-11', legacy: false },
    scriptSha: SHA,
    script: 'return 1',
    refundSha: REFUND_SHA,
    refundScript: 'return 2',
    ...over,
  };
}

/**
 * A Redis whose script keeps whole tokens per key (no refill) and answers as lua/token_bucket.lua does; its refund
 * script (REFUND_SHA, or the source 'return 2') answers as lua/refund.lua does, and is logged in `refunds` apart.
 */
class ScriptedRedis implements DirectRedis {
  readonly calls: { keys: string[]; argv: string[]; how: 'evalsha' | 'eval' }[] = [];
  readonly refunds: { keys: string[]; argv: string[]; how: 'evalsha' | 'eval' }[] = [];
  readonly tokens = new Map<string, number>();
  fail: Error | undefined;
  refundFail: Error | undefined;
  /** The refund script answers as one run past its deadline. */
  refundLate = false;
  /** While set, bucket-script calls (and refund calls) wait for it before they answer. */
  gate: Promise<void> | undefined;
  refundGate: Promise<void> | undefined;
  noScript = false;
  late = false;

  evalsha(sha: string, numKeys: number, ...args: string[]): Promise<unknown> {
    if (this.noScript) return Promise.reject(new Error('NOSCRIPT No matching script.'));
    if (sha === REFUND_SHA) return this.#refund('evalsha', numKeys, args);
    return this.#run('evalsha', numKeys, args);
  }

  eval(script: string, numKeys: number, ...args: string[]): Promise<unknown> {
    if (script === 'return 2') return this.#refund('eval', numKeys, args);
    return this.#run('eval', numKeys, args);
  }

  /** ARGV: n, the record flag, per bucket the micro-tokens back and the capacity at the take, then a deadline. */
  async #refund(how: 'evalsha' | 'eval', numKeys: number, args: string[]): Promise<unknown> {
    const keys = args.slice(0, numKeys);
    const argv = args.slice(numKeys);
    this.refunds.push({ keys, argv, how });
    await this.refundGate;
    if (this.refundFail !== undefined) return Promise.reject(this.refundFail);
    if (this.refundLate) return Promise.resolve([-1]);
    const out: number[] = [];
    keys.forEach((key, i) => {
      const have = this.tokens.get(key);
      if (have === undefined) return out.push(0, -1);
      const after = Math.max(have, Math.min(have + Number(argv[2 + 2 * i]), Number(argv[3 + 2 * i])));
      this.tokens.set(key, after);
      out.push(after - have, after);
    });
    out.push(0);
    return Promise.resolve(out);
  }

  async #run(how: 'evalsha' | 'eval', numKeys: number, args: string[]): Promise<unknown> {
    const keys = args.slice(0, numKeys);
    const argv = args.slice(numKeys);
    this.calls.push({ keys, argv, how });
    await this.gate;
    if (this.fail !== undefined) return Promise.reject(this.fail);
    if (this.late) return Promise.resolve([-1]);
    const out: number[] = [];
    // ARGV: G, deadline, then per request: n=1, flags, idem_ttl, capacity, rate, cost, ttl.
    keys.forEach((key, r) => {
      const capacity = Number(argv[2 + r * 7 + 3]);
      const cost = Number(argv[2 + r * 7 + 5]);
      const have = this.tokens.get(key) ?? capacity;
      const fits = have >= cost;
      if (fits) this.tokens.set(key, have - cost);
      // Refused: a token in 2 s, or never (-1) for a cost above the capacity.
      const retry = fits ? 0 : cost > capacity ? -1 : 2000;
      out.push(fits ? 1 : 0, 0, fits ? 1 : 0, fits ? have - cost : have, retry, 5000);
    });
    return Promise.resolve(out);
  }
}

/** The cost of each request of a script call, micro-tokens: a check's own, or with the tokens taken ahead in it. */
function costs(call: { argv: string[] }): string[] {
  return Array.from({ length: Number(call.argv[0]) }, (_, r) => call.argv[2 + r * 7 + 5]!);
}

/** A decider over `redis` whose agent answers each term request with `answer`; the clock is `clock.now`. */
function setup(
  answer: (body: TermRequest) => { status: number; json: unknown; code?: string },
  options: Omit<DirectOptions, 'redis'> = {},
) {
  const redis = new ScriptedRedis();
  const asked: TermRequest[] = [];
  const clock = { now: 1000 };
  const decider = new DirectDecider(
    (body) => {
      asked.push(body);
      const a = answer(body);
      return Promise.resolve({ status: a.status, json: a.json, code: a.code });
    },
    { redis, ...options },
    () => clock.now,
  );
  return { redis, asked, clock, decider };
}

const settle = () => new Promise((r) => setImmediate(r));
const one = { policy: 'writes', subject: 'tenant-1' };

/** A bucket of 100: a tenth of it (10 tokens) is worth a take ahead. */
const BIG = { bucket: { capacity: 100, refillPerSecond: 0.5, ttlMs: 60_000 }, limit: 100 };

/** A decider holding a term of BIG (and `over`), whose `one` was checked once at 1,000: its pace has started. */
async function paced(options: Omit<DirectOptions, 'redis'> = {}, over: Partial<TermResponse> = {}) {
  const s = setup(() => ({ status: 200, json: term({ ...BIG, ...over }) }), options);
  void s.decider.decide(one);
  await settle();
  await s.decider.decide(one);
  return s;
}

/** A decider whose `count` subjects `t-0`… each hold 10 tokens taken ahead (checked twice, 100 ms apart). */
async function holding(count: number) {
  const s = setup(() => ({ status: 200, json: term(BIG) }));
  void s.decider.decide(one);
  await settle();
  const subjects = Array.from({ length: count }, (_, i) => ({ policy: 'writes', subject: `t-${i}` }));
  await Promise.all(subjects.map(async (c) => s.decider.decide(c)));
  s.clock.now = 1100;
  await Promise.all(subjects.map(async (c) => s.decider.decide(c)));
  return s;
}

describe('direct decisions in the client', () => {
  it('asks the agent until a term is held, then decides on the term with its bucket, key and deadline', async () => {
    const { redis, asked, decider } = setup(() => ({ status: 200, json: term() }));
    expect(decider.decide(one)).toBeUndefined();
    await settle();
    expect(asked).toEqual([{ policy: 'writes', script: true }]);
    const d = await decider.decide(one);
    expect(d).toMatchObject({
      allowed: true,
      local: 'direct',
      retryAfterMs: 0,
      results: [
        { policy: 'writes', allowed: true, remaining: 9, limit: 10, retryAfterMs: 0, mode: 'regional' },
      ],
    });
    expect(d!.headers).toEqual({
      'RateLimit-Policy': '"writes";q=10;w=20',
      RateLimit: '"writes";r=9;t=5',
    });
    expect(redis.calls).toHaveLength(1);
    expect(redis.calls[0]!.keys).toEqual(['rl:v3:{tenant-1}:writes']);
    // One request; the call's own deadline (the term's 5 s of Redis time stands for 1,000 + 1,000 ms here, so
    // now + the 100 ms timeout is 4.1 s); capacity in micro-tokens, refill, cost 1 token, the idle TTL.
    expect(redis.calls[0]!.argv).toEqual([
      '1',
      '4100000',
      '1',
      '0',
      '0',
      '10000000',
      '0.5',
      '1000000',
      '60000',
    ]);
    expect(decider.stats()).toMatchObject({ admitted: 1, refused: 0, toAgent: { no_term: 1 }, calls: 1 });
  });

  it('decides the checks of one turn in one script call', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: term() }));
    void decider.decide(one);
    await settle();
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        Promise.resolve(decider.decide({ policy: 'writes', subject: `t-${i % 3}` })),
      ),
    );
    expect(redis.calls).toHaveLength(1);
    expect(redis.calls[0]!.argv[0]).toBe('12');
    expect(answers.map((a) => a!.results[0]!.remaining)).toEqual([9, 9, 9, 8, 8, 8, 7, 7, 7, 6, 6, 6]);
  });

  it('a final refusal is answered here, as the agent would; a refusal the agent could cover goes to it', async () => {
    const final = setup(() => ({
      status: 200,
      json: term({ bucket: { capacity: 1, refillPerSecond: 0.5, ttlMs: 60_000 }, limit: 1 }),
    }));
    void final.decider.decide(one);
    await settle();
    expect((await final.decider.decide(one))!.allowed).toBe(true);
    const refused = await final.decider.decide(one);
    expect(refused).toMatchObject({
      allowed: false,
      retryAfterMs: 2000,
      local: 'direct',
      results: [{ allowed: false, remaining: 0, limit: 1, retryAfterMs: 2000, reason: 'subject_exhausted' }],
    });
    expect(refused!.headers['Retry-After']).toBe('2');
    const borrows = setup(() => ({
      status: 200,
      json: term({
        bucket: { capacity: 1, refillPerSecond: 0.5, ttlMs: 60_000 },
        refusals: 'agent',
        budget: { capacity: 3, refillPerSecond: 1.5 },
      }),
    }));
    void borrows.decider.decide(one);
    await settle();
    const admitted = await borrows.decider.decide(one);
    // Headers of a bucket that borrows describe the subject's global budget.
    expect(admitted!.headers['RateLimit-Policy']).toBe('"writes";q=3;w=20');
    expect(await borrows.decider.decide(one)).toBeUndefined();
    expect(borrows.decider.stats()).toMatchObject({ admitted: 1, refused: 0, toAgent: { refused: 1 } });
  });

  it('remembers a final refusal until its retry-after: the same subject and cost is refused with no call', async () => {
    const small = {
      bucket: { capacity: 2, refillPerSecond: 0.5, ttlMs: 60_000 },
      limit: 2,
      validForMs: 2000,
      maxCost: 2,
    };
    let answer = term(small);
    const { redis, clock, decider, asked } = setup(() => ({ status: 200, json: answer }));
    void decider.decide(one);
    await settle();
    for (const allowed of [true, true, false]) expect((await decider.decide(one))!.allowed).toBe(allowed);
    expect(redis.calls).toHaveLength(3);
    // Refused at 1,000 with a token in 2,000 ms: remembered until 2,000 (the call's send time + DENIAL_RECHECK_MS,
    // before the retry-after's 2,999), then asked of Redis again.
    clock.now = 1400;
    const again = decider.decide(one);
    expect(again).not.toBeInstanceOf(Promise);
    expect(again).toMatchObject({
      allowed: false,
      retryAfterMs: 1600,
      local: 'direct',
      results: [
        {
          allowed: false,
          remaining: 0,
          limit: 2,
          retryAfterMs: 1600,
          resetMs: 4600,
          reason: 'subject_exhausted',
        },
      ],
    });
    expect((again as DirectDecision).headers['Retry-After']).toBe('2');
    // Another cost has a retry-after of its own: it goes to Redis (and is remembered beside the first), as does
    // another subject.
    expect((await decider.decide({ ...one, cost: 2 }))!.allowed).toBe(false);
    expect(redis.calls).toHaveLength(4);
    expect((await decider.decide({ ...one, cost: 2 }))!.allowed).toBe(false);
    expect((await decider.decide({ policy: 'writes', subject: 'tenant-2' }))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(5);
    clock.now = 1999; // the term is renewed from 2,000: still the same one
    expect((await decider.decide(one))!.allowed).toBe(false);
    expect(redis.calls).toHaveLength(5);
    // Recalled: the script was not asked.
    const { recalled, refused } = decider.stats();
    expect({ recalled, refused }).toEqual({ recalled: 3, refused: 5 });
    // Past DENIAL_RECHECK_MS the check goes to Redis again (refused: the old term's bucket is still empty); a grown
    // share (a new bucket in the next term; tokens refilled meanwhile) would forget it too.
    answer = term({ ...small, bucket: { capacity: 4, refillPerSecond: 1, ttlMs: 60_000 }, limit: 4 });
    clock.now = 2100;
    void decider.decide(one);
    await settle();
    expect(asked).toHaveLength(2);
    expect(redis.calls).toHaveLength(6);
    redis.tokens.clear();
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(7);
    // Every refusal, recalled or not, counts as the subject's demand in the renewal's usage.
    clock.now = 3200;
    void decider.decide({ policy: 'writes', subject: 'tenant-3' });
    await settle();
    // The check at 2,100 that asked for the new term was still refused under the old one, by Redis.
    expect(asked[2]!.usage).toContainEqual(['tenant-1', 1, 1]);
    expect(asked[1]!.usage).toContainEqual(['tenant-1', 2, 7]);
  });

  it('remembers a cost the bucket can never pay for the rest of the term; another cost still goes to Redis', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: term({ maxCost: 20 }) }));
    void decider.decide(one);
    await settle();
    const never = await decider.decide({ ...one, cost: 11 });
    expect(never!.results[0]).toMatchObject({
      allowed: false,
      retryAfterMs: null,
      reason: 'cost_exceeds_share',
    });
    expect((await decider.decide({ ...one, cost: 11 }))!.results[0]).toMatchObject({
      retryAfterMs: null,
      resetMs: 5000,
      reason: 'cost_exceeds_share',
    });
    expect(redis.calls).toHaveLength(1);
    expect((await decider.decide({ ...one, cost: 12 }))!.results[0]!.reason).toBe('cost_exceeds_share');
    expect((await decider.decide({ ...one, cost: 10 }))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(3);
    expect(decider.stats().recalled).toBe(1);
  });

  it('forgets a remembered refusal once a term says refusals go to the agent (borrowing turned on), same bucket', async () => {
    const bucket = { capacity: 1, refillPerSecond: 0.5, ttlMs: 60_000 };
    let answer = term({ bucket });
    const { redis, clock, decider } = setup(() => ({ status: 200, json: answer }));
    void decider.decide(one);
    await settle();
    await decider.decide(one);
    expect((await decider.decide(one))!.allowed).toBe(false);
    expect((await decider.decide(one))!.allowed).toBe(false);
    expect(decider.stats().recalled).toBe(1);
    answer = term({ bucket, refusals: 'agent', budget: { capacity: 3, refillPerSecond: 1.5 } });
    clock.now = 1500;
    void decider.decide({ policy: 'writes', subject: 'other' });
    await settle();
    const calls = redis.calls.length;
    expect(await decider.decide(one)).toBeUndefined();
    expect(redis.calls).toHaveLength(calls + 1);
    expect(decider.stats()).toMatchObject({ recalled: 1, toAgent: { refused: 1 } });
  });

  it('never remembers a refusal the agent could cover (the policy borrows)', async () => {
    const { redis, decider } = setup(() => ({
      status: 200,
      json: term({ bucket: { capacity: 1, refillPerSecond: 0.5, ttlMs: 60_000 }, refusals: 'agent' }),
    }));
    void decider.decide(one);
    await settle();
    await decider.decide(one);
    for (let i = 0; i < 3; i++) expect(await decider.decide(one)).toBeUndefined();
    expect(redis.calls).toHaveLength(4);
    expect(decider.stats()).toMatchObject({ recalled: 0, toAgent: { refused: 3 } });
  });

  it('sends to the agent what a term does not cover: classes, costs above maxCost, excluded or unnormalized subjects, idempotency, dry runs, layered checks', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: term({ maxCost: 2 }) }));
    void decider.decide(one);
    await settle();
    const misses = [
      { ...one, class: 'gold' },
      { ...one, cost: 3 },
      { ...one, cost: 1.5 },
      { policy: 'writes', subject: 'vip' },
      { policy: 'writes', subject: 'has space' },
      { ...one, idempotencyKey: 'k' },
      { ...one, dryRun: true },
      { checks: [one] },
    ];
    for (const m of misses) expect(decider.decide(m as never)).toBeUndefined();
    expect(decider.stats().toAgent.not_direct).toBe(7);
    expect(await decider.decide({ ...one, cost: 2 })).toMatchObject({
      allowed: true,
      results: [{ remaining: 8 }],
    });
    expect(redis.calls).toHaveLength(1);
  });

  it("a subject that is not a string, or a cost that is not a number, is the agent's to refuse: never a throw here", async () => {
    const { redis, asked, decider } = setup(() => ({ status: 200, json: term({ maxCost: 2 }) }));
    void decider.decide(one);
    await settle();
    // A caller's own input passed on unchecked: the agent answers each with a 400.
    const hostile = [
      { policy: 'writes', subject: 42 },
      { policy: 'writes', subject: null },
      { policy: 'writes', subject: ['a'] },
      { policy: 'writes', subject: { toString: () => 'tenant-1' } },
      { ...one, cost: NaN },
      { ...one, cost: '1' },
      { ...one, cost: null },
    ];
    for (const h of hostile) expect(decider.decide(h as never), JSON.stringify(h)).toBeUndefined();
    expect(decider.stats().toAgent.not_direct).toBe(hostile.length);
    // A policy name that is not a string is not one this process asks terms for.
    expect(decider.decide({ policy: 42, subject: 'tenant-1' } as never)).toBeUndefined();
    await settle();
    expect(asked).toHaveLength(1);
    expect(redis.calls).toHaveLength(0);
    expect(decider.stats()).toMatchObject({ admitted: 0, refused: 0 });
  });

  it('uses a term until validForMs after its request was sent, less a margin, and renews it from half way', async () => {
    const { asked, clock, decider } = setup(() => ({ status: 200, json: term() }));
    void decider.decide(one); // sent at 1000
    clock.now = 1200;
    await settle();
    expect(decider.decide(one)).toBeDefined();
    expect(asked).toHaveLength(1);
    clock.now = 1500; // half way: the next term is asked for, this one still used
    expect(decider.decide(one)).toBeDefined();
    expect(asked).toHaveLength(2);
    // The renewal never came back before the first term ran out: 1000 + 1000 - 20.
    const slow = setup(() => ({ status: 200, json: term() }));
    void slow.decider.decide(one);
    await settle();
    slow.clock.now = 1979;
    expect(slow.decider.decide(one)).toBeDefined();
    slow.clock.now = 1980;
    expect(slow.decider.decide(one)).toBeUndefined();
  });

  it("a check queued past its term's end goes to the agent without a call", async () => {
    const { redis, clock, decider } = setup(() => ({ status: 200, json: term() }));
    void decider.decide(one);
    await settle();
    const pending = decider.decide(one);
    clock.now = 5000;
    expect(await pending).toBeUndefined();
    expect(redis.calls).toHaveLength(0);
    expect(decider.stats().toAgent.late).toBe(1);
  });

  it('a call the script refuses for its deadline, or that fails, sends its checks to the agent; three failures pause for a second', async () => {
    const { redis, clock, decider } = setup(() => ({ status: 200, json: term({ validForMs: 2000 }) }));
    void decider.decide(one);
    await settle();
    redis.late = true;
    expect(await decider.decide(one)).toBeUndefined();
    expect(decider.stats().toAgent.late).toBe(1);
    redis.late = false;
    redis.fail = new Error('connection lost');
    for (let i = 0; i < 3; i++) expect(await decider.decide(one)).toBeUndefined();
    expect(decider.stats()).toMatchObject({ calls: 4, callsFailed: 3, toAgent: { failed: 3 } });
    redis.fail = undefined;
    expect(decider.decide(one)).toBeUndefined(); // paused: no call
    expect(redis.calls).toHaveLength(4);
    clock.now += 1000;
    expect((await decider.decide(one))!.allowed).toBe(true);
  });

  it('a Redis that lost its script cache gets the source the agent sent (EVAL)', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: term() }));
    void decider.decide(one);
    await settle();
    redis.noScript = true;
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls.map((c) => c.how)).toEqual(['eval']);
  });

  it('reports what a term decided with the next request, once: a failed request is not sent again with it', async () => {
    let status = 200;
    const { asked, clock, decider } = setup(() => ({ status, json: term() }));
    void decider.decide(one);
    await settle();
    for (const subject of ['tenant-1', 'tenant-1', 't2']) await decider.decide({ policy: 'writes', subject });
    status = 503;
    clock.now = 1600;
    void decider.decide(one);
    await settle();
    expect(asked[1]!.usage).toEqual([
      ['tenant-1', 2, 0],
      ['t2', 1, 0],
    ]);
    // Failed: asked again after 250 ms with only what came since (the check at 1,600 and this one; the one at
    // 1,800 is still on its way to Redis when the request at 1,900 leaves). The agent counted the first usage
    // if the request reached it, so it is never sent twice.
    await decider.decide(one);
    status = 200;
    clock.now = 1800;
    void decider.decide(one);
    clock.now = 1900;
    void decider.decide(one);
    await settle();
    expect(asked).toHaveLength(3);
    expect(asked[2]!.usage).toEqual([['tenant-1', 2, 0]]);
  });

  it('reports the busiest 1,024 subjects, and fewer after the agent found a body too large', async () => {
    let status = 200;
    const answer = () =>
      status === 200
        ? { status, json: term({ validForMs: 2000 }) }
        : { status, json: { code: 'AGT_ERR_BODY_TOO_LARGE' }, code: 'AGT_ERR_BODY_TOO_LARGE' };
    const { asked, clock, decider } = setup(answer);
    void decider.decide(one);
    await settle();
    // 1,100 subjects of 20 characters, subject i decided (i % 3) + 1 times.
    const subject = (i: number) => `s-${String(i).padStart(18, '0')}`;
    const checks = Array.from({ length: 1100 }, (_, i) =>
      Array.from({ length: (i % 3) + 1 }, () =>
        Promise.resolve(decider.decide({ policy: 'writes', subject: subject(i) })),
      ),
    ).flat();
    await Promise.all(checks);
    status = 413;
    clock.now = 2000;
    void decider.decide(one);
    await settle();
    const first = asked[1]!.usage!;
    expect(first).toHaveLength(1024);
    expect(first.slice(0, 3)).toEqual([
      [subject(2), 3, 0],
      [subject(5), 3, 0],
      [subject(8), 3, 0],
    ]);
    // The next renewal carries at most 32 KiB: 50 bytes an entry here, so 655 of them.
    for (let i = 0; i < 1100; i++) await decider.decide({ policy: 'writes', subject: subject(i) });
    status = 200;
    clock.now = 2300;
    void decider.decide(one);
    await settle();
    expect(asked[2]!.usage).toHaveLength(655);
  });

  it.each([
    [400, 'AGT_ERR_TERM_NOT_ALLOWED'],
    [404, 'AGT_ERR_TERMS_OFF'],
    [404, 'AGT_ERR_UNKNOWN_POLICY'],
  ])(
    'a policy the agent gives no terms for (%i %s) is asked again only after a minute',
    async (status, code) => {
      const { asked, clock, decider } = setup(() => ({ status, json: { code }, code }));
      void decider.decide(one);
      await settle();
      clock.now = 50_000;
      void decider.decide(one);
      await settle();
      expect(asked).toHaveLength(1);
      expect(decider.stats().terms).toEqual({ taken: 0, notAllowed: 1, failed: 0, usageDropped: 0 });
      clock.now = 61_001;
      void decider.decide(one);
      expect(asked).toHaveLength(2);
    },
  );

  it('an answer that is not a term is a failed request, never a term', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: { ...term(), deadlineMicros: -1 } }));
    void decider.decide(one);
    await settle();
    expect(decider.decide(one)).toBeUndefined();
    expect(decider.stats().terms.failed).toBe(1);
    expect(redis.calls).toHaveLength(0);
  });

  it('a script Redis lacks and this process has no source of (an upgraded agent) is asked for with the next term', async () => {
    let sha = SHA;
    const { redis, asked, clock, decider } = setup(() => ({
      status: 200,
      // The first agent sends its script's source; the upgraded one's term names another script, without it.
      json: sha === SHA ? term() : { ...term({ scriptSha: sha }), script: undefined },
    }));
    void decider.decide(one);
    await settle();
    sha = 'b'.repeat(40);
    clock.now = 1600;
    void decider.decide(one); // renews: the new term names a script whose source never came
    await settle();
    redis.noScript = true;
    expect(await decider.decide(one)).toBeUndefined();
    expect(decider.stats().callsFailed).toBe(1);
    clock.now = 2200;
    void decider.decide(one);
    await settle();
    expect(asked.map((a) => a.script)).toEqual([true, undefined, true]);
  });

  it('subjects hashed by the agent: keyed with the same secret, or the policy is decided at the agent', async () => {
    const secret = 'a-secret-of-16-chars-or-more';
    const hashed = term({ hashed: { fingerprint: termKeyFingerprint(secret) } });
    const send = (json: unknown) => () => Promise.resolve({ status: 200, json, code: undefined });
    const redis = new ScriptedRedis();
    const keyed = new DirectDecider(send(hashed), { redis, hmacSecret: secret }, () => 1000);
    void keyed.decide(one);
    await settle();
    expect(await keyed.decide(one)).toMatchObject({ allowed: true, local: 'direct' });
    const key = normalizeSubject('tenant-1', { hmacSecret: secret });
    expect(key.ok && redis.calls[0]!.keys).toEqual([`rl:v3:{${key.ok ? key.subject : ''}}:writes`]);
    // A raw subject the agent would refuse without a secret is a subject like any other once hashed.
    expect(await keyed.decide({ policy: 'writes', subject: 'has space' })).toMatchObject({ allowed: true });
    for (const options of [{}, { hmacSecret: 'another-secret-of-16-chars' }]) {
      const other = new DirectDecider(send(hashed), { redis: new ScriptedRedis(), ...options }, () => 1000);
      void other.decide(one);
      await settle();
      expect(other.decide(one)).toBeUndefined();
      expect(other.stats().terms).toEqual({ taken: 0, notAllowed: 1, failed: 0, usageDropped: 0 });
    }
  });

  it('a client deciding directly takes no grants unless asked to', () => {
    const redis = new ScriptedRedis();
    const direct = new AgentClient({ baseUrl: 'http://127.0.0.1:9', direct: { redis } });
    const both = new AgentClient({ baseUrl: 'http://127.0.0.1:9', direct: { redis }, grants: {} });
    expect(direct.grantStats()).toBeUndefined();
    expect(both.grantStats()).toBeDefined();
    expect(direct.directStats()).toMatchObject({ admitted: 0, refused: 0 });
    direct.close();
    both.close();
  });

  it("takes tokens ahead for a subject checked often, in its check's own request, and spends them with no call", async () => {
    const { redis, clock, decider } = setup(() => ({ status: 200, json: term(BIG) }));
    void decider.decide(one);
    await settle();
    // The first check sets the pace's clock; nothing is taken ahead (no pace yet).
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls[0]!.keys).toEqual(['rl:v3:{tenant-1}:writes']);
    // 100 ms later: a pace of 10/s over half the 5 s horizon is 25 tokens, capped at a tenth of the bucket (10) (and
    // at the 98 - 50 that keep the bucket half full). The take rides in the check's request: one bucket operation
    // of cost 11. The check is told the 10 taken count in what its subject has left.
    clock.now = 1100;
    const second = await decider.decide(one);
    expect(second).toMatchObject({ allowed: true, local: 'direct', results: [{ remaining: 98 }] });
    expect(second).not.toHaveProperty('aheadMs');
    expect(redis.calls).toHaveLength(2);
    expect(redis.calls[1]!.keys).toEqual(['rl:v3:{tenant-1}:writes']);
    expect(redis.calls[1]!.argv.slice(0, 2)).toEqual(['1', expect.any(String)]);
    expect(costs(redis.calls[1]!)).toEqual(['11000000']);
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(88_000_000);
    // The next ten checks spend them here: admitted with no call, told what sequential checks would be told, each
    // answered inline (no promise to wait on).
    const spent: DirectDecision[] = [];
    for (let i = 0; i < 10; i++) {
      const decision = decider.decide(one);
      expect(decision).not.toBeInstanceOf(Promise);
      spent.push(decision as DirectDecision);
    }
    expect(redis.calls).toHaveLength(2);
    expect(spent.map((d) => d.results[0]!.remaining)).toEqual([97, 96, 95, 94, 93, 92, 91, 90, 89, 88]);
    expect(spent.every((d) => d.allowed && d.local === 'direct')).toBe(true);
    expect(spent[0]!.headers.RateLimit).toBe('"writes";r=97;t=5');
    // Another subject has no pace: its check goes to Redis, alone.
    expect((await decider.decide({ policy: 'writes', subject: 'tenant-2' }))!.allowed).toBe(true);
    expect(redis.calls.at(-1)!.keys).toEqual(['rl:v3:{tenant-2}:writes']);
    // Spent: the next check of tenant-1 goes to Redis again, and takes ahead again.
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(costs(redis.calls.at(-1)!)).toEqual(['11000000']);
    expect(decider.stats()).toMatchObject({
      admitted: 14,
      calls: 4,
      grants: {
        taken: 2,
        tokens: 20,
        spent: 10,
        returned: 0,
        dropped: 0,
        returnCalls: 0,
        returnsFailed: 0,
        short: 0,
      },
    });
  });

  it("admits a burst's checks that queued while their subject's take was on the wire on the tokens it took", async () => {
    const { redis, clock, decider } = await paced({
      maxBatch: 1,
      callsInFlight: 1,
    });
    clock.now = 1100;
    // One call on the wire at a time: the first check and its take leave, the other three wait for it.
    const burst = await Promise.all(Array.from({ length: 4 }, () => Promise.resolve(decider.decide(one))));
    expect(burst.every((d) => d!.allowed && d!.local === 'direct')).toBe(true);
    expect(redis.calls).toHaveLength(2);
    expect(burst.map((d) => d!.results[0]!.remaining)).toEqual([98, 97, 96, 95]);
    expect(decider.stats().grants).toEqual({
      taken: 1,
      tokens: 10,
      spent: 3,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 0,
    });
  });

  it('spends tokens taken ahead only within the horizon from their take', async () => {
    const { redis, clock, decider } = await paced({ grants: { horizonMs: 1000 } }, { validForMs: 2000 });
    clock.now = 1100;
    await decider.decide(one);
    // A pace of 10/s over half the 1,000 ms horizon: 5 tokens, spent until 1,900 (the take's send + four fifths of
    // the horizon), handed back by 2,100.
    expect(decider.stats().grants).toEqual({
      taken: 1,
      tokens: 5,
      spent: 0,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 0,
    });
    clock.now = 1200;
    // An admission on a token taken ahead says how long before it the take was sent: its decision's instant.
    expect(await decider.decide(one)).toMatchObject({ allowed: true, aheadMs: 100 });
    clock.now = 1899;
    expect(await decider.decide(one)).toMatchObject({ allowed: true, aheadMs: 799 });
    expect(redis.calls).toHaveLength(2);
    clock.now = 1900;
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(93_000_000);
    expect((await decider.decide(one))!.allowed).toBe(true);
    // The 3 left are handed back, to the bucket they came from, capped at its capacity then (100), by the end of
    // the horizon in Redis time (the term's 5 s stand for its end at 3,000: 2,100 is 4.1 s); this check takes again
    // at the pace now averaged (200 ms: 2 tokens).
    await settle();
    expect(redis.refunds).toEqual([
      {
        keys: ['rl:v3:{tenant-1}:writes'],
        argv: ['1', '0', '3000000', '100000000', '4100000'],
        how: 'evalsha',
      },
    ]);
    expect(decider.stats().grants).toEqual({
      taken: 2,
      tokens: 7,
      spent: 2,
      returned: 3,
      dropped: 0,
      returnCalls: 1,
      returnsFailed: 0,
      short: 0,
    });
    expect(redis.calls).toHaveLength(3);
    // 93, less this check and its take of 2, plus the 3 back.
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(93_000_000);
  });

  it('spends tokens taken ahead only while the term holds the bucket they came from', async () => {
    let bucket = { capacity: 100, refillPerSecond: 0.5, ttlMs: 60_000 };
    const { redis, clock, decider } = setup(() => ({ status: 200, json: term({ bucket, limit: 100 }) }));
    void decider.decide(one);
    await settle();
    await decider.decide(one);
    clock.now = 1100;
    await decider.decide(one);
    clock.now = 1200;
    await decider.decide(one);
    expect(decider.stats().grants).toEqual({
      taken: 1,
      tokens: 10,
      spent: 1,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 0,
    });
    // The share shrinks: the renewal from half way brings a smaller bucket. The check that asks for it is still
    // decided under the term held, on its tokens; the next, under the new bucket, drops them and goes to Redis.
    bucket = { ...bucket, capacity: 50 };
    clock.now = 1500;
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(2);
    await settle();
    clock.now = 1510;
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(3);
    // Handed back with the capacity they were taken under (the script caps at the lower of it and the bucket's).
    await settle();
    expect(redis.refunds.map((r) => r.argv)).toEqual([['1', '0', '8000000', '100000000', '9100000']]);
    expect(decider.stats().grants).toMatchObject({ spent: 2, returned: 8, dropped: 0 });
  });

  it("admits on a take's tokens the checks of its subject that its own call's bucket refused after it", async () => {
    // 60 checks of one subject in one turn, on a bucket of 60: the first carries a take of 10 (a request of 11),
    // the other 59 ride in the same call with none, and Redis runs them after the take. The bucket pays 49 of
    // them; the last 10 are paid by the 10 taken, as they are with no take at all. Also when refusals go to the
    // agent (the policy borrows): tokens held here need no agent.
    const key = 'rl:v3:{tenant-1}:writes';
    const cases = [
      { options: {}, over: {} },
      { options: { grants: false as const }, over: {} },
      { options: {}, over: { refusals: 'agent' as const, budget: { capacity: 300, refillPerSecond: 1.5 } } },
    ];
    for (const { options, over } of cases) {
      const { redis, clock, decider } = await paced(options, over);
      redis.tokens.set(key, 60_000_000);
      clock.now = 1100;
      const burst = await Promise.all(Array.from({ length: 60 }, () => Promise.resolve(decider.decide(one))));
      expect(burst.filter((d) => d?.allowed === true)).toHaveLength(60);
      expect(redis.calls).toHaveLength(2);
      expect(costs(redis.calls[1]!)).toHaveLength(60);
      const stats = decider.stats();
      expect(stats).toMatchObject({ admitted: 61, refused: 0, recalled: 0, toAgent: { refused: 0 } });
      // Exactly what left the bucket: 60, the take's 10 included, and none of them held any more.
      expect(redis.tokens.get(key)).toBe(0);
      const { tokens, spent } = stats.grants;
      expect(tokens - spent).toBe(0);
      if (options.grants === false) {
        expect(costs(redis.calls[1]!)[0]).toBe('1000000');
        expect(stats.grants).toMatchObject({ taken: 0, spent: 0 });
        continue;
      }
      expect(costs(redis.calls[1]!)[0]).toBe('11000000');
      expect(stats.grants).toMatchObject({ taken: 1, tokens: 10, spent: 10, short: 0 });
      // What sequential checks would have said: the bucket was empty, the tokens taken counted down.
      expect(burst.slice(50).map((d) => d!.results[0]!.remaining)).toEqual([9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
      expect(burst.slice(50).every((d) => d!.local === 'direct' && d!.aheadMs === 0)).toBe(true);
      await decider.close();
      expect(redis.refunds).toEqual([]);
      expect(redis.tokens.get(key)).toBe(0);
    }
  });

  it('takes nothing ahead that would leave the bucket below half full, nor when asked not to', async () => {
    for (const options of [{}, { grants: false as const }]) {
      const { redis, clock, decider } = setup(() => ({ status: 200, json: term(BIG) }), options);
      redis.tokens.set('rl:v3:{tenant-1}:writes', 56_000_000);
      void decider.decide(one);
      await settle();
      for (let i = 0; i < 5; i++) {
        clock.now += 10;
        expect((await decider.decide(one))!.allowed).toBe(true);
      }
      // 55 left after the first check: the second takes 4 (55 - 1 - 50), leaving the bucket at half, which the
      // third to fifth checks spend from; no take after (the bucket is at half).
      const takes = redis.calls.filter((c) => costs(c)[0] !== '1000000');
      expect(takes).toHaveLength(options.grants === false ? 0 : 1);
      expect(decider.stats().grants.taken).toBe(takes.length);
      if (takes.length > 0) expect(costs(takes[0]!)).toEqual(['5000000']);
      expect(redis.calls).toHaveLength(options.grants === false ? 5 : 2);
      expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(
        options.grants === false ? 51_000_000 : 50_000_000,
      );
    }
  });

  it('a burst larger than the take: its tokens admit what they cover, the rest of the burst goes to Redis', async () => {
    const { redis, clock, decider } = await paced({
      maxBatch: 1,
      callsInFlight: 1,
    });
    clock.now = 1100;
    const burst = await Promise.all(Array.from({ length: 14 }, () => Promise.resolve(decider.decide(one))));
    expect(burst.every((d) => d!.allowed)).toBe(true);
    // The first check and its take of 10; ten queued checks on them; the last three, one call each.
    expect(decider.stats().grants).toEqual({
      taken: 1,
      tokens: 10,
      spent: 10,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 0,
    });
    expect(redis.calls).toHaveLength(5);
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(85_000_000);
  });

  it('a take the bucket is short of (another process drained it) holds nothing; its check goes again alone', async () => {
    const { redis, clock, decider } = await paced();
    // Another process leaves 5 tokens: this one still thinks 99 are left, and asks for 10 with its next check. The
    // bucket cannot pay both, so neither is charged, and the check goes again alone, in the next call.
    redis.tokens.set('rl:v3:{tenant-1}:writes', 5_000_000);
    clock.now = 1100;
    expect((await decider.decide(one))!).toMatchObject({ allowed: true, results: [{ remaining: 4 }] });
    expect(redis.calls.slice(1).map(costs)).toEqual([['11000000'], ['1000000']]);
    expect(decider.stats().grants).toEqual({
      taken: 0,
      tokens: 0,
      spent: 0,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 1,
    });
    expect(decider.stats()).toMatchObject({ admitted: 2, calls: 3 });
    // Nothing held: the next check is a call, and with 4 left it asks for no take (the bucket is below half full).
    clock.now = 1200;
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(redis.calls).toHaveLength(4);
    expect(costs(redis.calls[3]!)).toEqual(['1000000']);
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(3_000_000);
    // A bucket short of the check too: the check alone is refused as any other, and remembered. (The take asked
    // for is 8: 59 left after the first check, less this one and the half to keep.)
    redis.tokens.set('rl:v3:{tenant-2}:writes', 60_000_000);
    const two = { policy: 'writes', subject: 'tenant-2' };
    await decider.decide(two);
    clock.now = 1300;
    redis.tokens.set('rl:v3:{tenant-2}:writes', 0);
    expect(await decider.decide(two)).toMatchObject({
      allowed: false,
      results: [{ remaining: 0, reason: 'subject_exhausted' }],
    });
    expect(redis.calls.slice(5).map(costs)).toEqual([['9000000'], ['1000000']]);
    expect(await decider.decide(two)).toMatchObject({ allowed: false });
    expect(redis.calls).toHaveLength(7);
    expect(decider.stats()).toMatchObject({ refused: 2, recalled: 1, grants: { taken: 0, short: 2 } });
  });

  it("a call that carries a take and another subject's check answers each from its own reply", async () => {
    const { redis, clock, decider } = await paced();
    redis.tokens.set('rl:v3:{tenant-2}:writes', 0);
    clock.now = 1100;
    const [first, other] = await Promise.all([
      decider.decide(one)!,
      decider.decide({ policy: 'writes', subject: 'tenant-2' })!,
    ]);
    expect(redis.calls[1]!.keys).toEqual(['rl:v3:{tenant-1}:writes', 'rl:v3:{tenant-2}:writes']);
    expect(costs(redis.calls[1]!)).toEqual(['11000000', '1000000']);
    expect(first).toMatchObject({ allowed: true, results: [{ remaining: 98 }] });
    expect(other).toMatchObject({ allowed: false, results: [{ remaining: 0, reason: 'subject_exhausted' }] });
    expect(decider.stats().grants).toMatchObject({ taken: 1, tokens: 10 });
  });

  it('a failed call with a take sends its check to the agent and lets the next check take again', async () => {
    const { redis, clock, decider } = await paced();
    redis.fail = new Error('connection reset');
    clock.now = 1100;
    expect(await decider.decide(one)).toBeUndefined();
    expect(costs(redis.calls[1]!)).toEqual(['11000000']);
    redis.fail = undefined;
    clock.now = 1200;
    expect((await decider.decide(one))!.allowed).toBe(true);
    expect(costs(redis.calls[2]!)).toEqual(['11000000']);
    expect(decider.stats().grants).toMatchObject({ taken: 1, tokens: 10 });
  });

  it('hands back what a forgotten or closed pace holds, in calls of at most 16 buckets; close settles once they answered', async () => {
    // 20 subjects, each checked twice 100 ms apart: each takes 10 ahead with its second check.
    const { redis, decider } = await holding(20);
    expect(decider.stats().grants).toMatchObject({ taken: 20, tokens: 200 });
    expect(redis.tokens.get('rl:v3:{t-7}:writes')).toBe(88_000_000);
    await decider.close();
    expect(redis.refunds.map((r) => r.keys.length)).toEqual([16, 4]);
    expect(redis.refunds[1]!.argv).toEqual([
      '4',
      '0',
      ...Array.from({ length: 4 }, () => ['10000000', '100000000']).flat(),
      '9100000',
    ]);
    expect(redis.tokens.get('rl:v3:{t-7}:writes')).toBe(98_000_000);
    expect(decider.stats().grants).toEqual({
      taken: 20,
      tokens: 200,
      spent: 0,
      returned: 200,
      dropped: 0,
      returnCalls: 2,
      returnsFailed: 0,
      short: 0,
    });
  });

  it('keeps at most two hand-back calls on the wire; the rest leave as they answer', async () => {
    const { redis, decider } = await holding(40);
    let open!: () => void;
    redis.refundGate = new Promise((r) => (open = r));
    const closing = decider.close();
    await settle();
    expect(redis.refunds.map((r) => r.keys.length)).toEqual([16, 16]);
    open();
    await closing;
    expect(redis.refunds.map((r) => r.keys.length)).toEqual([16, 16, 8]);
    expect(decider.stats().grants).toMatchObject({ tokens: 400, returned: 400, returnCalls: 3 });
  });

  it('what the bucket cannot take back (full again, its key gone) or a failed hand-back is counted dropped', async () => {
    const { redis, clock, decider } = await paced();
    clock.now = 1100;
    await decider.decide(one);
    // The bucket refilled to 95 of 100 meanwhile: 5 of the 10 fit.
    redis.tokens.set('rl:v3:{tenant-1}:writes', 95_000_000);
    await decider.close();
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(100_000_000);
    expect(decider.stats().grants).toMatchObject({
      returned: 5,
      dropped: 5,
      returnCalls: 1,
      returnsFailed: 0,
      short: 0,
    });

    const failing = await paced();
    failing.clock.now = 1100;
    await failing.decider.decide(one);
    failing.redis.refundFail = new Error('connection reset');
    await failing.decider.close();
    expect(failing.decider.stats().grants).toMatchObject({ returned: 0, dropped: 10, returnsFailed: 1 });
    // A refund the client never got an answer for may have run: it is never sent again.
    expect(failing.redis.refunds).toHaveLength(1);
  });

  it('a Redis that lost the refund script gets its source the agent sent (EVAL)', async () => {
    const { redis, clock, decider } = await paced();
    clock.now = 1100;
    await decider.decide(one);
    redis.noScript = true;
    await decider.close();
    expect(redis.refunds.map((r) => r.how)).toEqual(['eval']);
    expect(decider.stats().grants).toMatchObject({ returned: 10, dropped: 0 });
  });

  it('hands back tokens whose spending time ran out with no check (a sweep), and none past the horizon', async () => {
    const { redis, clock, decider } = await paced({ grants: { horizonMs: 1000 } }, { validForMs: 2000 });
    clock.now = 1100;
    await decider.decide(one);
    expect(decider.stats().grants).toMatchObject({ taken: 1, tokens: 5 });
    // No check comes; spending time ends at 1,900: the sweep (every 100 ms here) hands the 5 back.
    clock.now = 1900;
    await new Promise((r) => setTimeout(r, 150));
    expect(redis.refunds.map((r) => r.argv)).toEqual([['1', '0', '5000000', '100000000', '4100000']]);
    expect(decider.stats().grants).toMatchObject({ returned: 5, dropped: 0 });

    // Tokens first looked at past the horizon (a loop busy for a second) are dropped, with no call: the bucket may
    // have refilled to its capacity since the take and been spent again.
    const late = await paced({ grants: { horizonMs: 1000 } }, { validForMs: 2000 });
    late.clock.now = 1100;
    await late.decider.decide(one);
    late.clock.now = 2100;
    await late.decider.close();
    expect(late.redis.refunds).toEqual([]);
    expect(late.decider.stats().grants).toMatchObject({ returned: 0, dropped: 5, returnCalls: 0 });
  });

  it("with the shortest horizon (500 ms) a quiet subject's tokens are handed back by a sweep, not dropped", async () => {
    // The sweep's own timer, stepped with the clock: every 50 ms, the shortest it runs at.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const { redis, clock, decider } = await paced({ grants: { horizonMs: 500 } }, { validForMs: 2000 });
      clock.now = 1100;
      await decider.decide(one);
      // A pace of 10/s over half the horizon: 2 tokens, spent until 1,500, handed back by 1,600.
      expect(decider.stats().grants).toMatchObject({ taken: 1, tokens: 2 });
      // No check comes: a sweep in the last fifth of the horizon (two of them fit in it) hands them back.
      while (clock.now < 1700) {
        clock.now += 50;
        vi.advanceTimersByTime(50);
        await settle();
      }
      expect(redis.refunds.map((r) => r.argv.slice(0, 4))).toEqual([['1', '0', '2000000', '100000000']]);
      expect(decider.stats().grants).toMatchObject({ returned: 2, dropped: 0, returnCalls: 1 });
    } finally {
      vi.useRealTimers();
    }
  });

  it('a hand-back that ran past its deadline in Redis gave nothing back: dropped, counted', async () => {
    const { redis, clock, decider } = await paced();
    clock.now = 1100;
    await decider.decide(one);
    redis.refundLate = true;
    await decider.close();
    expect(redis.refunds).toHaveLength(1);
    expect(decider.stats().grants).toMatchObject({
      returned: 0,
      dropped: 10,
      returnCalls: 1,
      returnsFailed: 1,
      short: 0,
    });
  });

  it('close waits for a take still on the wire and hands its tokens back; a second close gives the same promise', async () => {
    const { redis, clock, decider } = await paced();
    let open!: () => void;
    redis.gate = new Promise((r) => (open = r));
    clock.now = 1100;
    const check = decider.decide(one)!;
    await settle();
    expect(costs(redis.calls.at(-1)!)).toEqual(['11000000']);
    let closed = false;
    const closing = decider.close();
    expect(decider.close()).toBe(closing);
    void closing.then(() => (closed = true));
    await settle();
    expect(closed).toBe(false);
    open();
    expect((await check)!.allowed).toBe(true);
    await closing;
    // The take's 10 went back: the bucket holds 100 less the two checks.
    expect(redis.refunds.map((r) => r.argv.slice(0, 4))).toEqual([['1', '0', '10000000', '100000000']]);
    expect(redis.tokens.get('rl:v3:{tenant-1}:writes')).toBe(98_000_000);
    expect(decider.stats().grants).toMatchObject({ taken: 1, tokens: 10, returned: 10, dropped: 0 });
  });

  it('each renewal looks at 2,048 paces, going on from where the last stopped: quiet ones are forgotten', async () => {
    const { clock, decider } = setup(() => ({ status: 200, json: term({ ...BIG, validForMs: 2000 }) }));
    void decider.decide(one);
    await settle();
    clock.now = 100;
    const subjects = Array.from({ length: 3000 }, (_, i) => ({ policy: 'writes', subject: `t-${i}` }));
    await Promise.all(subjects.map((s) => Promise.resolve(decider.decide(s))));
    expect(decider.stats().paced).toBe(3000);
    // Quiet for a horizon, and the term ran out: the check asks for the next, and that renewal forgets the first
    // 2,048 paces only.
    clock.now = 5200;
    expect(decider.decide(one)).toBeUndefined();
    await settle();
    expect(decider.stats().paced).toBe(952);
    // The next renewal (from half way) goes on: the other 952 are forgotten; this check's new pace is kept.
    clock.now = 6300;
    await decider.decide(one);
    await settle();
    expect(decider.stats().paced).toBe(1);
  });

  it('takes nothing ahead under a term that names no refund script (an agent from before hand-backs)', async () => {
    const { redis, clock, decider } = await paced({}, { refundSha: undefined, refundScript: undefined });
    for (let i = 1; i <= 5; i++) {
      clock.now = 1000 + 100 * i;
      expect((await decider.decide(one))!.allowed).toBe(true);
    }
    expect(redis.calls.every((c) => c.keys.length === 1)).toBe(true);
    expect(redis.calls).toHaveLength(6);
    expect(decider.stats().grants.taken).toBe(0);
  });

  it('refuses options it cannot work with', () => {
    const send = () => Promise.resolve({ status: 200, json: {}, code: undefined });
    expect(() => new DirectDecider(send, { redis: {} as DirectRedis })).toThrow(/evalsha/);
    expect(() => new DirectDecider(send, { redis: new ScriptedRedis(), maxBatch: 0 })).toThrow(/maxBatch/);
    expect(() => new DirectDecider(send, { redis: new ScriptedRedis(), timeoutMs: 0 })).toThrow(/timeoutMs/);
    expect(() => new DirectDecider(send, { redis: new ScriptedRedis(), grants: { horizonMs: 0 } })).toThrow(
      /horizonMs/,
    );
    // A hand-back window (the horizon's last fifth) shorter than two sweeps (50 ms each) would mostly be missed.
    expect(() => new DirectDecider(send, { redis: new ScriptedRedis(), grants: { horizonMs: 499 } })).toThrow(
      'direct: grants.horizonMs must be an integer from 500 to 10000',
    );
    expect(
      () => new DirectDecider(send, { redis: new ScriptedRedis(), grants: { horizonMs: 500 } }),
    ).not.toThrow();
  });
});

describe('direct decisions: what a refusal, a report or an odd body leads to (found by review)', () => {
  it('a refusal while the subject holds tokens taken ahead is not remembered: its next check asks Redis', async () => {
    const { redis, clock, decider } = setup(() => ({ status: 200, json: term({ ...BIG, maxCost: 20 }) }));
    void decider.decide(one);
    await settle();
    await decider.decide(one);
    clock.now = 1100;
    // The second check takes 10 ahead (a tenth of the bucket of 100): held here.
    expect(costs((await decider.decide(one), redis.calls.at(-1)!))).toEqual(['11000000']);
    // Others spend the bucket down to 5 meanwhile: a check of 11 (more than the 10 held) goes to Redis, refused.
    redis.tokens.set('rl:v3:{tenant-1}:writes', 5_000_000);
    clock.now = 1200;
    const calls = redis.calls.length;
    expect((await decider.decide({ ...one, cost: 11 }))!.allowed).toBe(false);
    expect(redis.calls).toHaveLength(calls + 1);
    // Not remembered: the 10 held go back to the bucket within the horizon, and then it holds 15.
    const again = decider.decide({ ...one, cost: 11 });
    expect(again).toBeInstanceOf(Promise);
    expect((await again)!.allowed).toBe(false);
    expect(redis.calls).toHaveLength(calls + 2);
    expect(decider.stats().recalled).toBe(0);
  });

  it('a body the agent would refuse (dryRun not a boolean, an unknown key) is the agent’s: not decided here', async () => {
    const { redis, decider } = setup(() => ({ status: 200, json: term() }));
    void decider.decide(one);
    await settle();
    for (const body of [
      { ...one, dryRun: 'true' },
      { ...one, dryRun: 1 },
      { ...one, dry_run: true },
    ] as unknown as (typeof one)[]) {
      expect(decider.decide(body), JSON.stringify(body)).toBeUndefined();
    }
    expect(redis.calls).toHaveLength(0);
    expect(decider.stats().toAgent.not_direct).toBe(3);
    // dryRun false is a decision like any other.
    expect((await decider.decide({ ...one, dryRun: false }))!.allowed).toBe(true);
  });

  it('a report refused as more than one term admits (a policy lowered) is dropped, and the term asked again at once', async () => {
    let lowered = false;
    const { asked, clock, decider } = setup((body) =>
      lowered && body.usage !== undefined
        ? { status: 400, json: { code: 'AGT_ERR_INVALID_TERM' }, code: 'AGT_ERR_INVALID_TERM' }
        : {
            status: 200,
            json: term(
              lowered ? { bucket: { capacity: 2, refillPerSecond: 0.5, ttlMs: 60_000 }, limit: 2 } : {},
            ),
          },
    );
    void decider.decide(one);
    await settle();
    for (let i = 0; i < 5; i++) expect((await decider.decide(one))!.allowed).toBe(true);
    lowered = true;
    clock.now = 1800; // past the term's renewal point
    await decider.decide(one);
    await settle();
    await settle();
    expect(asked.slice(1).map((b) => b.usage !== undefined)).toEqual([true, false]);
    expect(decider.stats().terms).toMatchObject({ taken: 2, failed: 0, usageDropped: 1 });
    // The new term (capacity 2) is held: the next check is decided under it, not sent to the agent.
    clock.now = 1900;
    const d = await decider.decide({ policy: 'writes', subject: 'tenant-9' });
    expect(d).toMatchObject({ allowed: true, local: 'direct', results: [{ limit: 2 }] });
  });
});
