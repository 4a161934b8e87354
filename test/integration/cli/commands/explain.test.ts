/**
 * Explaining a decision on real agents and a coordinator: `GET /v1/explain` reads a subject's bucket by a dry run
 * (nothing charged), and `quotaplane explain` fans it out over the regions.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExplainResponse } from '../../../../core/wire/agent.js';
import { cli } from '../../../helpers/cli-runner.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

let stack: ServiceStack;
let agentsEnv: string;

// These tests are about what an explanation says, not about deadlines: on a loaded machine a Redis reply or a
// loan over NATS can take longer than the production 50 ms store timeout and 250 ms decision deadline, and a
// refusal would then truthfully say store_unavailable, or share_exhausted (a lender not heard in time) instead
// of subject_exhausted. Generous bounds keep every answer the one the counts below expect.
const PATIENT = { storeTimeoutMs: 2000, decisionDeadlineMs: 5000 };

beforeAll(async () => {
  // Rounds a minute apart: shares stay at their first thirds for the whole file, so counts are exact.
  stack = await startStack({
    agentsPerRegion: 1,
    rebalance: { roundMs: 60_000 },
    lease: { graceMs: 65_000 },
    agent: PATIENT,
  });
  // 9 tokens, a slow refill: each region starts with a third (3 tokens).
  await stack.putPolicy('explain-a', { capacity: 9, refillPerSecond: 0.01, maxCost: 9 });
  await stack.ready(['explain-a']);
  agentsEnv = stack.agents.map((a) => `${a.region}=${a.url}`).join(',');
}, 60_000);
afterAll(async () => {
  await stack?.[Symbol.asyncDispose]();
});

const explain = async (url: string, query: string) => {
  const res = await fetch(`${url}/v1/explain?${query}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

/** Decisions at `url` until one is refused (the bucket is empty there); at most 50. */
async function exhaust(url: string, subject: string): Promise<void> {
  for (let i = 0; i < 50; i++) {
    if (!(await decide(url, { policy: 'explain-a', subject })).body.allowed) return;
  }
  throw new Error(`${subject} was never refused`);
}

describe('GET /v1/explain', () => {
  it('shows the share, the limit and the tokens left, and changes nothing', async () => {
    const us = stack.inRegion('us')[0]!;
    const first = await explain(us.url, 'policy=explain-a&subject=t-1');
    expect(first.status).toBe(200);
    const body = ExplainResponse.parse(first.body);
    expect(body).toMatchObject({
      region: 'us',
      policy: 'explain-a',
      mode: 'regional',
      cost: 1,
      wouldAllow: true,
    });
    expect(body.share).toBe(0.3333);
    expect(body.limit).toBe(3);
    // A bucket never charged is full; explaining it again finds it full again: nothing was charged.
    expect(body.remaining).toBe(body.limit);
    const again = ExplainResponse.parse((await explain(us.url, 'policy=explain-a&subject=t-1')).body);
    expect(again.remaining).toBe(again.limit);
    await exhaust(us.url, 't-1');
    const empty = ExplainResponse.parse((await explain(us.url, 'policy=explain-a&subject=t-1')).body);
    expect(empty).toMatchObject({ remaining: 0, wouldAllow: false });
    expect(empty.retryAfterMs).toBeGreaterThan(0);
    // With borrowing on, a refusal would borrow first: what it would find, a dry run cannot know.
    expect(empty.reason).toBeUndefined();
  });

  it('shows the last refusal where it happened and null elsewhere', async () => {
    const us = stack.inRegion('us')[0]!;
    const before = Date.now();
    await exhaust(us.url, 't-4');
    const here = ExplainResponse.parse((await explain(us.url, 'policy=explain-a&subject=t-4')).body);
    // us borrowed the other regions' thirds before refusing: the subject used its whole budget.
    expect(here.lastRefusal).toMatchObject({
      reason: 'subject_exhausted',
      cost: 1,
      limit: 3,
      remaining: 0,
    });
    expect(here.lastRefusal!.retryAfterMs).toBeGreaterThan(0);
    const at = Date.parse(here.lastRefusal!.at);
    expect(at).toBeGreaterThanOrEqual(before - 1000);
    expect(at).toBeLessThanOrEqual(Date.now() + 1000);
    for (const region of ['eu', 'ap']) {
      const there = ExplainResponse.parse(
        (await explain(stack.inRegion(region)[0]!.url, 'policy=explain-a&subject=t-4')).body,
      );
      expect(there.lastRefusal).toBeNull();
    }
  });

  it('remembers no refusal of a dry run or of an explanation', async () => {
    const eu = stack.inRegion('eu')[0]!;
    // 4 tokens can never fit a third of 9: refused by a dry run and by an explanation, nothing remembered.
    const dry = await decide(eu.url, { policy: 'explain-a', subject: 't-5', cost: 4, dryRun: true });
    expect(dry.body.allowed).toBe(false);
    expect(dry.body.results![0]!.reason).toBe('cost_exceeds_share');
    const looked = ExplainResponse.parse((await explain(eu.url, 'policy=explain-a&subject=t-5&cost=4')).body);
    expect(looked).toMatchObject({ wouldAllow: false, reason: 'cost_exceeds_share', lastRefusal: null });
    // The same refusal in earnest is remembered.
    const real = await decide(eu.url, { policy: 'explain-a', subject: 't-5', cost: 4 });
    expect(real.body.allowed).toBe(false);
    const after = ExplainResponse.parse((await explain(eu.url, 'policy=explain-a&subject=t-5')).body);
    expect(after.lastRefusal).toMatchObject({ reason: 'cost_exceeds_share', cost: 4, retryAfterMs: null });
  });

  it('refuses bad queries with the agent codes', async () => {
    const us = stack.inRegion('us')[0]!;
    const missing = await explain(us.url, 'policy=explain-a');
    expect(missing.status).toBe(400);
    expect(missing.body['code']).toBe('AGT_ERR_INVALID_QUERY');
    const unknown = await explain(us.url, 'policy=nope&subject=t-1');
    expect(unknown.status).toBe(404);
    expect(unknown.body['code']).toBe('AGT_ERR_UNKNOWN_POLICY');
    const bad = await explain(us.url, 'policy=explain-a&subject=bad%20subject');
    expect(bad.status).toBe(400);
    expect(bad.body['code']).toBe('AGT_ERR_INVALID_SUBJECT');
  });
});

describe('quotaplane explain', () => {
  it('asks every region and prints one row each: empty in us, full elsewhere', async () => {
    const us = stack.inRegion('us')[0]!;
    await exhaust(us.url, 't-2');
    const at = ExplainResponse.parse((await explain(us.url, 'policy=explain-a&subject=t-2')).body)
      .lastRefusal!.at;
    // The CLI reads its clock 3 s after the refusal: ages are exact.
    const r = await cli(['explain', 'explain-a', 't-2'], {
      env: { QUOTAPLANE_AGENTS: agentsEnv },
      now: () => Date.parse(at) + 3000,
    });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const rows = r.stdout.trimEnd().split('\n');
    expect(rows[0]).toMatch(
      /^REGION\s+MODE\s+SHARE\s+LIMIT\s+REMAINING\s+WOULD ALLOW\s+RETRY AFTER MS\s+REASON\s+LAST REFUSAL$/,
    );
    expect(rows.find((l) => l.startsWith('us '))).toMatch(
      /^us\s+regional\s+[\d.]+%\s+3\s+0\s+no\s+\d+\s+bucket empty here\s+3\.0s ago: subject_exhausted$/,
    );
    // eu and ap never saw a request of the subject, but us borrowed their thirds before it was refused: the
    // subject used its whole global budget, and every region reads empty; neither refused it.
    for (const region of ['eu', 'ap'])
      expect(rows.find((l) => l.startsWith(`${region} `))).toMatch(
        new RegExp(
          `^${region}\\s+regional\\s+[\\d.]+%\\s+3\\s+0\\s+no\\s+\\d+\\s+bucket empty here\\s+none$`,
        ),
      );
    expect(rows.at(-1)).toBe(
      't-2 on explain-a: 0 of 9 tokens left across regions; last refused in us 3.0s ago: subject_exhausted',
    );

    const json = await cli([
      'explain',
      'explain-a',
      't-2',
      '--json',
      ...stack.agents.flatMap((a) => ['--agent', `${a.region}=${a.url}`]),
    ]);
    const parsed = JSON.parse(json.stdout) as {
      regions: { region: string; explain: ExplainResponse }[];
      summary: string;
    };
    expect(parsed.regions.map((x) => x.region).sort()).toEqual(['ap', 'eu', 'us']);
    expect(parsed.regions.find((x) => x.region === 'us')!.explain.remaining).toBe(0);
    expect(parsed.regions.find((x) => x.region === 'eu')!.explain.remaining).toBe(0);
    expect(parsed.regions.find((x) => x.region === 'us')!.explain.lastRefusal).toMatchObject({
      at,
      reason: 'subject_exhausted',
    });
    expect(parsed.regions.find((x) => x.region === 'eu')!.explain.lastRefusal).toBeNull();
    expect(parsed.summary).toMatch(
      /^t-2 on explain-a: 0 of 9 tokens left across regions; last refused in us [\d.]+s ago: subject_exhausted$/,
    );
  });

  it('reports an agent that does not answer and exits 1', async () => {
    const r = await cli([
      'explain',
      'explain-a',
      't-3',
      '--agent',
      'us=http://127.0.0.1:9',
      '--agent',
      `eu=${stack.inRegion('eu')[0]!.url}`,
    ]);
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(/^us\s+—.*unreachable/m);
    expect(r.stdout).toMatch(/^eu\s+regional/m);
    const none = await cli(['explain', 'explain-a', 't-3']);
    expect(none.status).toBe(2);
    expect(none.stderr).toContain('name the agents');
  });

  it('says a cost above maxCost once, as the caller’s mistake, and exits 1', async () => {
    const r = await cli(['explain', 'explain-a', 't-3', '--cost', '10'], {
      env: { QUOTAPLANE_AGENTS: agentsEnv },
    });
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr.trimEnd().split('\n')).toEqual([
      expect.stringMatching(/^quotaplane: AGT_ERR_COST_ABOVE_MAX \(400\): .*9/),
    ]);
  });
});

describe('borrowing off (QP_BORROWING=false): the reasons an agent that sees only its own bucket gives', () => {
  let off: ServiceStack;

  beforeAll(async () => {
    off = await startStack({
      regions: ['us', 'eu'],
      agentsPerRegion: 1,
      rebalance: { roundMs: 60_000 },
      lease: { graceMs: 65_000 },
      agent: { ...PATIENT, borrowing: false },
    });
    // 8 tokens, a slow refill: each region holds half (4 tokens).
    await off.putPolicy('halves', { capacity: 8, refillPerSecond: 0.01 });
    await off.putPolicy('homed', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 2,
      refillPerSecond: 0.01,
      maxCost: 2,
    });
    await off.ready(['halves', 'homed']);
  }, 60_000);
  afterAll(async () => {
    await off?.[Symbol.asyncDispose]();
  });

  it('a regional part used up is share_exhausted, in decision JSON, the explanation and the last refusal', async () => {
    const us = off.inRegion('us')[0]!;
    const eu = off.inRegion('eu')[0]!;
    for (let i = 0; i < 4; i++)
      expect((await decide(us.url, { policy: 'halves', subject: 'b-1' })).body.allowed).toBe(true);
    const refused = await decide(us.url, { policy: 'halves', subject: 'b-1' });
    expect(refused.body).toMatchObject({
      allowed: false,
      results: [{ allowed: false, remaining: 0, limit: 4, reason: 'share_exhausted' }],
    });
    const here = ExplainResponse.parse((await explain(us.url, 'policy=halves&subject=b-1')).body);
    expect(here).toMatchObject({
      share: 0.5,
      limit: 4,
      remaining: 0,
      wouldAllow: false,
      reason: 'share_exhausted',
      lastRefusal: { reason: 'share_exhausted', cost: 1, limit: 4, remaining: 0 },
    });
    // The other half is still there, untouched: the reason told the truth.
    const there = ExplainResponse.parse((await explain(eu.url, 'policy=halves&subject=b-1')).body);
    expect(there).toMatchObject({ share: 0.5, limit: 4, remaining: 4, wouldAllow: true, lastRefusal: null });
    expect(there.reason).toBeUndefined();

    const at = here.lastRefusal!.at;
    const r = await cli(['explain', 'halves', 'b-1', '--agent', `us=${us.url}`, '--agent', `eu=${eu.url}`], {
      now: () => Date.parse(at) + 12_000,
    });
    expect(r.status).toBe(0);
    expect(r.stdout.trimEnd().split('\n').at(-1)).toBe(
      'b-1 on halves: 4 of 8 tokens left across regions; last refused in us 12s ago: share_exhausted',
    );
  });

  it('a bucket that holds the whole budget (a strict policy) used up is subject_exhausted, wherever asked', async () => {
    const us = off.inRegion('us')[0]!;
    const eu = off.inRegion('eu')[0]!;
    expect((await decide(us.url, { policy: 'homed', subject: 'b-2', cost: 2 })).body.allowed).toBe(true);
    for (const agent of [us, eu]) {
      const refused = await decide(agent.url, { policy: 'homed', subject: 'b-2' });
      expect(refused.body).toMatchObject({
        allowed: false,
        results: [{ mode: 'strict', remaining: 0, limit: 2, reason: 'subject_exhausted' }],
      });
    }
    // Both regions answered a refusal to their callers: each remembers its own (eu's was decided in us).
    for (const agent of [us, eu]) {
      const seen = ExplainResponse.parse((await explain(agent.url, 'policy=homed&subject=b-2')).body);
      expect(seen).toMatchObject({
        mode: 'strict',
        reason: 'subject_exhausted',
        lastRefusal: { reason: 'subject_exhausted', limit: 2, remaining: 0 },
      });
    }
    const r = await cli(['explain', 'homed', 'b-2', '--agent', `us=${us.url}`, '--agent', `eu=${eu.url}`]);
    expect(r.stdout.trimEnd().split('\n').at(-1)).toMatch(
      /^b-2 on homed: 0 of 2 tokens left at its home; last refused in eu [\d.]+s ago: subject_exhausted$/,
    );
  });
});
