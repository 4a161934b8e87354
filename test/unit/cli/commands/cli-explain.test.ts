/**
 * `quotaplane explain` over agents that answer from a table (no network): one row per region with its last
 * refusal, and the summary line, for the cases the integration tests cannot stage at will.
 */
import { describe, expect, it } from 'vitest';
import type { ExplainResponse } from '../../../../core/wire/agent.js';
import { cli } from '../../../helpers/cli-runner.js';

const NOW = Date.parse('2026-12-04T10:00:00.000Z');

function answer(region: string, over: Partial<ExplainResponse> = {}): ExplainResponse {
  return {
    region,
    policy: 'demo',
    mode: 'regional',
    share: 0.3333,
    epoch: 4,
    limit: 10,
    remaining: 4,
    cost: 1,
    wouldAllow: true,
    retryAfterMs: 0,
    lastRefusal: null,
    ...over,
  };
}

/** An agent's problem document, as it answers a request it refuses. */
interface Refusal {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
}

const costAboveMax: Refusal = {
  status: 400,
  code: 'AGT_ERR_COST_ABOVE_MAX',
  detail: 'cost 60 is above maxCost 50 of policy "demo"',
};

type AgentAnswer = ExplainResponse | Refusal | undefined;

/** Agents at http://REGION.test answering `answers[REGION]`; a region without one is unreachable. */
function agents(answers: Record<string, AgentAnswer>): typeof fetch {
  return (input) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    const region = new URL(url).hostname.replace('.test', '');
    const body = answers[region];
    if (body === undefined) return Promise.reject(new Error('connect ECONNREFUSED'));
    if ('code' in body) {
      const problem = { type: 'about:blank', title: 'Bad Request', ...body };
      return Promise.resolve(Response.json(problem, { status: body.status }));
    }
    return Promise.resolve(Response.json(body));
  };
}

const run = (answers: Record<string, AgentAnswer>, extra: string[] = []) =>
  cli(['explain', 'demo', 'tenant-1', ...extra], {
    env: {
      QUOTAPLANE_AGENTS: Object.keys(answers)
        .map((r) => `${r}=http://${r}.test`)
        .join(','),
    },
    fetch: agents(answers),
    now: () => NOW,
  });

const refusal = (at: string, reason: 'subject_exhausted' | 'share_exhausted' | null) => ({
  at,
  reason,
  cost: 1,
  limit: 10,
  remaining: 0,
  retryAfterMs: 1200,
});

describe('quotaplane explain', () => {
  it('sums the tokens left, and names the latest refusal of any region', async () => {
    const r = await run({
      us: answer('us', { lastRefusal: refusal('2026-12-04T09:59:48.000Z', 'subject_exhausted') }),
      eu: answer('eu', {
        remaining: 0,
        wouldAllow: false,
        retryAfterMs: 1200,
        lastRefusal: refusal('2026-12-04T09:59:57.000Z', 'share_exhausted'),
      }),
      ap: answer('ap', { remaining: 8 }),
    });
    expect(r.status).toBe(0);
    const rows = r.stdout.trimEnd().split('\n');
    expect(rows[1]).toMatch(/^us\s.*\s12s ago: subject_exhausted$/);
    expect(rows[2]).toMatch(/^eu\s.*\sbucket empty here\s+3\.0s ago: share_exhausted$/);
    expect(rows[3]).toMatch(/^ap\s.*\snone$/);
    expect(rows[4]).toBe(
      'tenant-1 on demo: 12 of 30 tokens left across regions; last refused in eu 3.0s ago: share_exhausted',
    );
  });

  it('says when nothing was refused, and when a region did not answer (exit 1)', async () => {
    const r = await run({ us: answer('us'), eu: undefined });
    expect(r.status).toBe(1);
    expect(r.stdout.trimEnd().split('\n').at(-1)).toBe(
      'tenant-1 on demo: 4 of 10 tokens left across regions (eu did not answer); no refusal remembered',
    );
  });

  it('counts a strict policy once (every region shows its home bucket), and reads agents without lastRefusal', async () => {
    const strict = { mode: 'strict' as const, share: null, epoch: null, limit: 5, remaining: 2 };
    const old = answer('eu', strict);
    delete old.lastRefusal;
    const r = await run({
      us: answer('us', { ...strict, lastRefusal: refusal('2026-12-04T09:58:00.000Z', null) }),
      eu: old,
    });
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^eu\s.*\snone$/m);
    expect(r.stdout.trimEnd().split('\n').at(-1)).toBe(
      'tenant-1 on demo: 2 of 5 tokens left at its home; last refused in us 120s ago: bucket empty',
    );
  });

  it('prints every field and the summary with --json', async () => {
    const r = await run(
      { us: answer('us', { lastRefusal: refusal('2026-12-04T09:59:59.000Z', 'subject_exhausted') }) },
      ['--json'],
    );
    const json = JSON.parse(r.stdout) as {
      regions: { region: string; explain: ExplainResponse }[];
      summary: string;
    };
    expect(json.regions[0]!.explain.lastRefusal).toEqual(
      refusal('2026-12-04T09:59:59.000Z', 'subject_exhausted'),
    );
    expect(json.summary).toBe(
      'tenant-1 on demo: 4 of 10 tokens left across regions; last refused in us 1.0s ago: subject_exhausted',
    );
  });

  it("says a request every region refused once, as the caller's mistake, and exits 1", async () => {
    const r = await run({ us: costAboveMax, eu: costAboveMax, ap: costAboveMax });
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      'quotaplane: AGT_ERR_COST_ABOVE_MAX (400): cost 60 is above maxCost 50 of policy "demo"\n',
    );
  });

  it('names the regions of each refusal when they differ, and the ones that did not answer', async () => {
    const unknown = { status: 404, code: 'AGT_ERR_UNKNOWN_POLICY', detail: 'no policy "demo"' };
    const r = await run({ us: costAboveMax, eu: unknown, ap: undefined });
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr.split('\n')).toEqual([
      'quotaplane: AGT_ERR_COST_ABOVE_MAX (400): cost 60 is above maxCost 50 of policy "demo" (us)',
      'quotaplane: AGT_ERR_UNKNOWN_POLICY (404): no policy "demo" (eu)',
      'quotaplane: ap did not answer: unreachable: connect ECONNREFUSED',
      '',
    ]);
  });

  it('keeps the table when some regions explain, and says which refused', async () => {
    const r = await run({ us: answer('us'), eu: costAboveMax });
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(/^eu\s.*AGT_ERR_COST_ABOVE_MAX \(400\)/m);
    expect(r.stdout.trimEnd().split('\n').at(-1)).toBe(
      'tenant-1 on demo: 4 of 10 tokens left across regions (eu refused it); no refusal remembered',
    );
  });
});
