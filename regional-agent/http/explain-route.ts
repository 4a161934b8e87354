/**
 * `GET /v1/explain?policy=P&subject=S[&cost=N]`: what this region would decide for one subject now, and why, by
 * a dry run of the real decision path (nothing charged, nothing written): the share and the limit it gives, the
 * tokens left, the reason a refusal would carry, and the subject's last refusal here (regional-agent/decisions/
 * refusal-memory.ts). Operators fan it out over regions (`quotaplane explain`).
 */
import type { FastifyInstance } from 'fastify';
import { roundShare } from '../../core/admin-numbers.js';
import { ExplainQuery, ExplainResponse } from '../../core/wire/agent.js';
import type { ShareView } from '../../core/shares/shares.js';
import type { DecisionService } from '../decisions/decision-service.js';
import type { RefusalMemory } from '../decisions/refusal-memory.js';
import { AgentErrors, withProblems } from '../errors.js';
import { CHECK_PROBLEMS, COMMON_PROBLEMS, problems } from './docs.js';

const schema = {
  summary: "Explain one subject's bucket in this region (a dry run: nothing charged or written)",
  tags: ['explain'],
  querystring: ExplainQuery,
  response: {
    200: ExplainResponse,
    ...problems({
      ...COMMON_PROBLEMS,
      400: ['AGT_ERR_INVALID_QUERY', ...CHECK_PROBLEMS[400]],
      404: CHECK_PROBLEMS[404],
    }),
  },
};

export interface ExplainOptions {
  service: DecisionService;
  shares: ShareView;
  /** Last refusals of this agent; without one, `lastRefusal` is null. */
  refusals?: RefusalMemory | undefined;
  region: string;
  assertServing: () => void;
}

export function explainRoute(
  app: FastifyInstance,
  { service, shares, refusals, region, assertServing }: ExplainOptions,
): void {
  app.get('/v1/explain', { schema }, async (request): Promise<ExplainResponse> => {
    assertServing();
    const query = ExplainQuery.safeParse(request.query);
    if (!query.success) {
      const problems = query.error.issues.map((i) => `${i.path.join('.') || 'query'}: ${i.message}`);
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_QUERY(problems.join('; ')), problems);
    }
    const { policy, subject } = query.data;
    const cost = query.data.cost ?? 1;
    // Prepared as a decision is, so the subject is normalized (or hashed) as the refusal memory keeps it.
    const prepared = service.prepare(service.parse({ policy, subject, cost, dryRun: true }));
    const outcome = await service.decide(prepared, request.id);
    const result = outcome.results[0]!;
    // As decided: a new subject past its policy's creation cap may have been moved to the shared bucket.
    const check = outcome.checks[0]!.prepared;
    // The subject as the router sized its bucket: a subject's own share is keyed by its normalized (or hashed) form.
    const share = result.mode === 'regional' ? shares.shareFor(policy, check.subject) : undefined;
    return {
      region,
      policy,
      mode: result.mode,
      share: share === undefined ? null : roundShare(share.share),
      epoch: share?.epoch ?? null,
      // Whole tokens, floored as decision JSON shows them. A dry run that fits answers what would be left after
      // it: the tokens now are that plus the cost.
      limit: Math.floor(result.limit),
      remaining: Math.floor(outcome.allowed ? result.remaining + cost : result.remaining),
      cost,
      wouldAllow: outcome.allowed,
      retryAfterMs: result.retryAfterMs,
      ...(result.reason !== undefined ? { reason: result.reason } : {}),
      lastRefusal: refusals?.last(check.policy.name, check.subject) ?? null,
    };
  });
}
