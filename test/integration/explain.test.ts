/**
 * Explaining a decision on real agents and a coordinator: `GET /v1/explain` reads a subject's bucket by a dry run
 * (nothing charged), and `quotaplane explain` fans it out over the regions.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExplainResponse } from '../../core/agent-wire.js';
import { cli } from '../helpers/cli-runner.js';
import { decide, MultiRegion } from '../helpers/multi-region.js';

let stack: MultiRegion;
let agentsEnv: string;

beforeAll(async () => {
  stack = await new MultiRegion({ agentsPerRegion: 1 }).start();
  // 9 tokens, a slow refill: each region starts with a third (3 tokens).
  await stack.putPolicy('explain-a', { capacity: 9, refillPerSecond: 0.01 });
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
    expect(empty.reason).toBeUndefined();
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
    const r = await cli(['explain', 'explain-a', 't-2'], { env: { QUOTAPLANE_AGENTS: agentsEnv } });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const rows = r.stdout.trimEnd().split('\n');
    expect(rows[0]).toMatch(
      /^REGION\s+MODE\s+SHARE\s+LIMIT\s+REMAINING\s+WOULD ALLOW\s+RETRY AFTER MS\s+REASON$/,
    );
    expect(rows.find((l) => l.startsWith('us '))).toMatch(
      /^us\s+regional\s+[\d.]+%\s+\d+\s+0\s+no\s+\d+\s+bucket empty here$/,
    );
    // eu and ap never saw a request of the subject, but us borrowed their thirds before it was refused: the
    // subject used its whole global budget, and every region reads empty.
    for (const region of ['eu', 'ap'])
      expect(rows.find((l) => l.startsWith(`${region} `))).toMatch(
        new RegExp(`^${region}\\s+regional\\s+[\\d.]+%\\s+\\d+\\s+0\\s+no\\s+\\d+\\s+bucket empty here$`),
      );

    const json = await cli([
      'explain',
      'explain-a',
      't-2',
      '--json',
      ...stack.agents.flatMap((a) => ['--agent', `${a.region}=${a.url}`]),
    ]);
    const parsed = JSON.parse(json.stdout) as {
      regions: { region: string; explain: { remaining: number } }[];
    };
    expect(parsed.regions.map((x) => x.region).sort()).toEqual(['ap', 'eu', 'us']);
    expect(parsed.regions.find((x) => x.region === 'us')!.explain.remaining).toBe(0);
    expect(parsed.regions.find((x) => x.region === 'eu')!.explain.remaining).toBe(0);
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
});
