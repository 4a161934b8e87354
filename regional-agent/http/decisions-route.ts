import type { FastifyInstance } from 'fastify';
import type { DecisionService } from '../decisions/decision-service.js';
import { decisionResponse } from './decision-reply.js';

export interface DecisionsRouteOptions {
  service: DecisionService;
  legacyHeaders: boolean;
  /** Refuses with AGT_ERR_NOT_READY until policies are known. */
  assertServing: () => void;
}

/**
 * `POST /v1/decisions`: always 200 for a decision (allowed or not, degraded or not); 4xx problem documents
 * for bad input, which changes nothing. Validation is the service's (a hand-written check proven equal to the
 * zod schema, zod only for the error list), so no schema is attached to the route.
 */
export function decisionsRoute(app: FastifyInstance, options: DecisionsRouteOptions): void {
  const { service, legacyHeaders, assertServing } = options;
  app.post('/v1/decisions', async (request, reply) => {
    assertServing();
    const outcome = await service.decideBody(request.body, request.id);
    return reply.header('x-request-id', request.id).send(decisionResponse(outcome, legacyHeaders));
  });
}
