/**
 * `quotaplane explain POLICY SUBJECT`: asks every region's agent what it would decide for the subject now, and
 * why (`GET /v1/explain`, a dry run: nothing charged), and prints one row per region with the subject's last
 * refusal there, then one line: the tokens left across regions and the latest refusal. Agents are named with
 * `--agent REGION=URL` (repeatable) or `QUOTAPLANE_AGENTS=us=http://…,eu=http://…`, or read from a stack's state
 * file (`--stack-state FILE`, the QP_STACK_STATE_FILE of `npm start`).
 */
import { readFile } from 'node:fs/promises';
import { ExplainResponse, Problem, type LastRefusal } from '../../core/wire/agent.js';
import { UsageError, type Context } from '../context.js';
import { numberFlag, parseFlags, positionals, stringFlag } from '../flags.js';
import { percent, relative, table } from '../table.js';

export const EXPLAIN_USAGE = `usage:
  quotaplane explain POLICY SUBJECT [--cost N] (--agent REGION=URL … | --stack-state FILE)
    agents also from $QUOTAPLANE_AGENTS (us=http://127.0.0.1:7101,eu=…)`;

async function agentsFrom(
  ctx: Context,
  values: Record<string, unknown>,
  agentFlags: string[],
): Promise<[string, string][]> {
  const pairs = (text: string) =>
    text
      .split(',')
      .map((s) => s.trim())
      .filter((s) => s !== '')
      .map((s) => {
        const at = s.indexOf('=');
        if (at <= 0) throw new UsageError(`agents are REGION=URL, got "${s}"`, EXPLAIN_USAGE);
        return [s.slice(0, at), s.slice(at + 1)] as [string, string];
      });
  // An empty list would ask nobody and answer "no region answered" with success.
  const some = (agents: [string, string][], why: string) => {
    if (agents.length === 0) throw new UsageError(why, EXPLAIN_USAGE);
    return agents;
  };
  if (agentFlags.length > 0) return some(agentFlags.flatMap(pairs), '--agent names no agent');
  const file = stringFlag(values['stack-state'] as string | undefined);
  if (file !== undefined) {
    let state: { agents?: Record<string, string> };
    try {
      state = JSON.parse(await readFile(file, 'utf8')) as { agents?: Record<string, string> };
    } catch (error) {
      throw new UsageError(`cannot read the stack state ${file}: ${(error as Error).message}`, EXPLAIN_USAGE);
    }
    return some(Object.entries(state.agents ?? {}), `the stack state ${file} names no agent`);
  }
  const env = ctx.io.env['QUOTAPLANE_AGENTS'];
  if (env !== undefined && env !== '') return some(pairs(env), 'QUOTAPLANE_AGENTS names no agent');
  throw new UsageError(
    'name the agents: --agent REGION=URL, --stack-state FILE or QUOTAPLANE_AGENTS',
    EXPLAIN_USAGE,
  );
}

/** A region's 4xx: the request was wrong there (cost above maxCost, unknown policy, invalid subject). */
export interface Refused {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
}

type Answer = { region: string; explain?: ExplainResponse; error?: string; refused?: Refused };

export async function explainCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const agentFlags: string[] = [];
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--agent') agentFlags.push(argv[++i] ?? '');
    else if (a.startsWith('--agent=')) agentFlags.push(a.slice('--agent='.length));
    else rest.push(a);
  }
  const parsed = parseFlags(
    rest,
    { cost: { type: 'string' }, 'stack-state': { type: 'string' } },
    EXPLAIN_USAGE,
  );
  const [policy, subject] = positionals(parsed, ['POLICY', 'SUBJECT'], EXPLAIN_USAGE);
  const cost = numberFlag(parsed.values['cost'], '--cost', EXPLAIN_USAGE);
  const agents = await agentsFrom(ctx, parsed.values, agentFlags);
  const fetcher = ctx.io.fetch ?? fetch;
  const answers: Answer[] = await Promise.all(
    agents.map(async ([region, url]): Promise<Answer> => {
      const q = new URLSearchParams({
        policy: policy!,
        subject: subject!,
        ...(cost !== undefined ? { cost: String(cost) } : {}),
      });
      try {
        const res = await fetcher(`${url.replace(/\/+$/, '')}/v1/explain?${q.toString()}`, {
          signal: AbortSignal.timeout(5000),
        });
        const body: unknown = await res.json().catch(() => undefined);
        if (res.ok) {
          const parsedBody = ExplainResponse.safeParse(body);
          return parsedBody.success
            ? { region, explain: parsedBody.data }
            : { region, error: 'not an agent explain answer' };
        }
        const problem = Problem.safeParse(body);
        if (!problem.success) return { region, error: `HTTP ${res.status}` };
        const error = `${problem.data.code} (${res.status}): ${problem.data.detail ?? ''}`;
        return res.status >= 400 && res.status < 500
          ? {
              region,
              error,
              refused: { status: res.status, code: problem.data.code, detail: problem.data.detail ?? '' },
            }
          : { region, error };
      } catch (error) {
        return { region, error: `unreachable: ${(error as Error).message}` };
      }
    }),
  );
  // Every region that answered refused the request itself: the caller's mistake, said once, not as a row each.
  const answered = answers.filter((a) => a.explain !== undefined || a.refused !== undefined);
  if (answered.length > 0 && answered.every((a) => a.refused !== undefined)) {
    ctx.io.stderr(refusedText(answers));
    return 1;
  }
  const now = ctx.now();
  const summary = summarize(policy!, subject!, answers, now);
  if (ctx.json) {
    ctx.printJson({ policy, subject, regions: answers, summary });
  } else {
    ctx.say(
      table(
        [
          'REGION',
          'MODE',
          'SHARE',
          'LIMIT',
          'REMAINING',
          'WOULD ALLOW',
          'RETRY AFTER MS',
          'REASON',
          'LAST REFUSAL',
        ],
        answers.map((a) =>
          a.explain === undefined
            ? [a.region, undefined, undefined, undefined, undefined, undefined, undefined, a.error, undefined]
            : [
                a.region,
                a.explain.mode,
                a.explain.share === null ? 'none' : percent(a.explain.share),
                a.explain.limit,
                a.explain.remaining,
                a.explain.wouldAllow,
                a.explain.retryAfterMs,
                a.explain.reason ?? (a.explain.wouldAllow ? '' : 'bucket empty here'),
                a.explain.lastRefusal == null
                  ? 'none'
                  : `${relative(a.explain.lastRefusal.at, now)}: ${refusalReason(a.explain.lastRefusal)}`,
              ],
        ),
      ),
    );
    ctx.say(summary);
  }
  // An agent that did not answer makes the explanation incomplete: say so in the status.
  return answers.some((a) => a.explain === undefined) ? 1 : 0;
}

/**
 * The agents' refusals of a request, each distinct one once with the regions that gave it
 * (`quotaplane: AGT_ERR_COST_ABOVE_MAX (400): … (us, eu, ap)`), then the regions that did not answer.
 */
export function refusedText(answers: readonly Answer[]): string {
  const groups = new Map<string, { refused: Refused; regions: string[] }>();
  for (const a of answers) {
    if (a.refused === undefined) continue;
    const key = `${a.refused.status} ${a.refused.code} ${a.refused.detail}`;
    const group = groups.get(key) ?? { refused: a.refused, regions: [] };
    group.regions.push(a.region);
    groups.set(key, group);
  }
  const everyRegion = groups.size === 1 && [...groups.values()][0]!.regions.length === answers.length;
  const lines = [...groups.values()].map(
    ({ refused, regions }) =>
      `quotaplane: ${refused.code} (${refused.status}): ${refused.detail}` +
      (everyRegion ? '' : ` (${regions.join(', ')})`),
  );
  const silent = answers.filter((a) => a.explain === undefined && a.refused === undefined);
  if (silent.length > 0)
    lines.push(
      `quotaplane: ${silent.map((a) => a.region).join(', ')} did not answer: ${silent[0]!.error ?? ''}`,
    );
  return `${lines.join('\n')}\n`;
}

/** A remembered refusal's reason as printed: an agent before reasons on every refusal gave none. */
function refusalReason(refusal: LastRefusal): string {
  return refusal.reason ?? 'bucket empty';
}

/**
 * One line for people: the tokens left of the limits across the regions that answered (a strict policy's
 * regions all show its home bucket: counted once) and the latest refusal remembered by any region.
 */
export function summarize(policy: string, subject: string, answers: readonly Answer[], now: number): string {
  const answered = answers.filter((a) => a.explain !== undefined);
  const silent = answers
    .filter((a) => a.explain === undefined && a.refused === undefined)
    .map((a) => a.region);
  const refused = answers.filter((a) => a.refused !== undefined).map((a) => `${a.region} refused it`);
  const counted = answered.every((a) => a.explain!.mode === 'strict') ? answered.slice(0, 1) : answered;
  const left = counted.reduce((sum, a) => sum + a.explain!.remaining, 0);
  const limit = counted.reduce((sum, a) => sum + a.explain!.limit, 0);
  const where =
    answered.length === 0
      ? 'no region answered'
      : `${left} of ${limit} tokens left ${
          counted.length === 1 && answered.length > 1 ? 'at its home' : 'across regions'
        }${[...refused, ...(silent.length > 0 ? [`${silent.join(', ')} did not answer`] : [])]
          .map((t) => ` (${t})`)
          .join('')}`;
  let latest: { region: string; refusal: LastRefusal } | undefined;
  for (const a of answered) {
    const r = a.explain!.lastRefusal;
    if (r == null) continue;
    if (latest === undefined || Date.parse(r.at) > Date.parse(latest.refusal.at))
      latest = { region: a.region, refusal: r };
  }
  const last =
    latest === undefined
      ? 'no refusal remembered'
      : `last refused in ${latest.region} ${relative(latest.refusal.at, now)}: ${refusalReason(latest.refusal)}`;
  return `${subject} on ${policy}: ${where}; ${last}`;
}
