import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ForwardAuthQuery } from '../../core/agent-wire.js';
import type { DecisionService } from '../decisions/decision-service.js';
import { AgentErrors, withProblems } from '../errors.js';
import { ipSubject } from './client-subject.js';
import { violatedPolicies } from './decision-reply.js';
import { rateLimitHeaders } from './rate-limit-headers.js';
import { limiterUnavailableProblem, quotaExceededProblem, sendProblem } from './problem.js';

export interface ForwardAuthOptions {
  service: DecisionService;
  legacyHeaders: boolean;
  /** Lower-case name of the header carrying the subject. */
  subjectHeader: string;
  /** True when the immediate peer is a configured trusted proxy (then its X-Forwarded-For names the client). */
  fromTrustedProxy: (request: FastifyRequest) => boolean;
  assertServing: () => void;
}

/**
 * `GET /v1/forward-auth?policy=P&cost=N` for nginx `auth_request`, Traefik ForwardAuth and Envoy ext_authz:
 * `204` allowed, `429` over quota, `503` when a fail-closed policy cannot decide, with the rate-limit headers on
 * all three. The subject comes from the trusted subject header; without it, from the client address, but only
 * when the request came through a trusted proxy (anyone else's address would be the proxy's own).
 * `/v1/forward-auth/<anything>` serves Envoy, whose ext_authz appends the original path.
 */
export function forwardAuthRoute(app: FastifyInstance, options: ForwardAuthOptions): void {
  const { service, legacyHeaders, subjectHeader, fromTrustedProxy, assertServing } = options;

  const answer = async (
    request: FastifyRequest,
    reply: FastifyReply,
    raw: unknown,
  ): Promise<FastifyReply> => {
    assertServing();
    const query = ForwardAuthQuery.safeParse(raw);
    if (!query.success) {
      const problems = query.error.issues.map((i) => `${i.path.join('.') || 'query'}: ${i.message}`);
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_QUERY(problems.join('; ')), problems);
    }
    const header = request.headers[subjectHeader];
    let subject = typeof header === 'string' && header.length > 0 ? header : undefined;
    if (subject === undefined && fromTrustedProxy(request)) subject = ipSubject(request.ip);
    if (subject === undefined) {
      throw new AgentErrors.AGT_ERR_MISSING_SUBJECT(
        `send the ${subjectHeader} header (the client address is used only behind a configured trusted proxy)`,
      );
    }
    const body =
      query.data.cost === undefined
        ? { policy: query.data.policy, subject }
        : { policy: query.data.policy, subject, cost: query.data.cost };
    const outcome = await service.decideBody(body, request.id);
    const headers = rateLimitHeaders(
      outcome.allowed,
      outcome.results.map((result, i) => ({
        result,
        windowSeconds: outcome.windows[i]!,
        violated: outcome.violated[i]!,
      })),
      legacyHeaders,
    );
    reply.headers(headers).header('x-request-id', request.id);
    if (outcome.allowed) return reply.code(204).send();
    const violated = violatedPolicies(outcome);
    return sendProblem(
      reply,
      outcome.unavailable ? limiterUnavailableProblem(violated) : quotaExceededProblem(violated),
    );
  };

  app.get('/v1/forward-auth', (request, reply) => answer(request, reply, request.query));

  // Envoy's HTTP ext_authz appends the original method, path and query to the configured prefix: the original
  // query is not ours, so policy and cost come from headers (`X-Quota-Policy`, `X-Quota-Cost`) there.
  app.all('/v1/forward-auth/*', (request, reply) => {
    const policy = request.headers['x-quota-policy'];
    const cost = request.headers['x-quota-cost'];
    const raw: Record<string, unknown> = { policy };
    if (cost !== undefined) raw['cost'] = cost;
    return answer(request, reply, raw);
  });
}
