import type { FastifyInstance } from 'fastify';
import { DecisionRequest, DecisionResponse } from '../../core/wire/agent.js';
import type { DecisionService } from '../decisions/decision-service.js';
import { decisionResponse } from './decision-reply.js';
import { CHECK_PROBLEMS, COMMON_PROBLEMS, problems } from './docs.js';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';

const schema = {
  summary: 'Decide one check or layered checks (all-or-nothing)',
  description:
    'Always 200 for a decision, allowed or not, degraded or not: `results` per check and the headers to forward. ' +
    'Bad input is a 4xx problem document and changes nothing.',
  tags: ['decisions'],
  body: DecisionRequest,
  response: {
    200: DecisionResponse,
    ...problems({
      ...COMMON_PROBLEMS,
      ...CHECK_PROBLEMS,
      400: [
        'AGT_ERR_INVALID_REQUEST',
        'AGT_ERR_MALFORMED_JSON',
        'AGT_ERR_TOO_MANY_CHECKS',
        ...CHECK_PROBLEMS[400],
      ],
      409: ['AGT_ERR_IDEMPOTENCY_CONFLICT'],
      413: ['AGT_ERR_BODY_TOO_LARGE'],
      415: ['AGT_ERR_UNSUPPORTED_MEDIA_TYPE'],
    }),
  },
};

export interface DecisionsRouteOptions {
  service: DecisionService;
  legacyHeaders: boolean;
  /** Which draft-ietf-httpapi-ratelimit-headers revision the headers follow (default draft-11). */
  rateLimitDraft?: RateLimitDraft | undefined;
  /** Refuses with AGT_ERR_NOT_READY until policies are known. */
  assertServing: () => void;
}

/**
 * `POST /v1/decisions`: always 200 for a decision (allowed or not, degraded or not); 4xx problem documents
 * for bad input, which changes nothing. Validation is the service's (a hand-written check proven equal to the
 * zod schema, zod only for the error list); the schema attached to the route documents it (http/docs.ts).
 */
export function decisionsRoute(app: FastifyInstance, options: DecisionsRouteOptions): void {
  const { service, legacyHeaders, rateLimitDraft, assertServing } = options;
  app.post('/v1/decisions', { schema }, async (request, reply) => {
    assertServing();
    const outcome = await service.decideBody(request.body, request.id);
    return reply
      .header('x-request-id', request.id)
      .send(decisionResponse(outcome, legacyHeaders, rateLimitDraft));
  });
}
