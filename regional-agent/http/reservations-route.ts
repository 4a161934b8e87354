/**
 * Reserve-then-commit on the wire (docs/reservations.md):
 * - `POST /v1/reservations`: decide `amount` on every check (200, as a decision) and, when admitted, hold it as a
 *   reservation (`reservation.id`);
 * - `POST /v1/reservations/{id}/commit` `{ "amount": used }`: keep `used`, refund the rest (idempotent);
 * - `DELETE /v1/reservations/{id}`: refund it all (idempotent).
 */
import type { FastifyInstance } from 'fastify';
import {
  CommitRequest,
  ReservationParams,
  ReservationRequest,
  ReservationResponse,
  SettlementResponse,
} from '../../core/models/reservation.js';
import { AgentErrors, withProblems } from '../errors.js';
import type { ReservationService } from '../reservations/reservation-service.js';
import { decisionResponse } from './decision-reply.js';
import { CHECK_PROBLEMS, COMMON_PROBLEMS, problems } from './docs.js';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';
import { ignoreContentTypeOfBodylessDelete } from '../../common/http/bodyless-delete.js';

const SETTLE_PROBLEMS = problems({
  ...COMMON_PROBLEMS,
  400: ['AGT_ERR_INVALID_RESERVATION', 'AGT_ERR_COMMIT_ABOVE_RESERVED'],
  404: ['AGT_ERR_UNKNOWN_RESERVATION'],
  409: ['AGT_ERR_RESERVATION_EXPIRED', 'AGT_ERR_RESERVATION_SETTLED'],
  421: ['AGT_ERR_WRONG_REGION'],
  503: [...COMMON_PROBLEMS[503], 'AGT_ERR_STORE_UNAVAILABLE'],
});

export interface ReservationsRouteOptions {
  reservations: ReservationService;
  legacyHeaders: boolean;
  /** Which draft-ietf-httpapi-ratelimit-headers revision the headers follow (default draft-11). */
  rateLimitDraft?: RateLimitDraft | undefined;
  assertServing: () => void;
}

export function reservationsRoute(app: FastifyInstance, options: ReservationsRouteOptions): void {
  const { reservations, legacyHeaders, rateLimitDraft, assertServing } = options;
  app.post(
    '/v1/reservations',
    {
      schema: {
        summary:
          'Reserve an amount before irreversible work (a decision that, admitted, can be settled later)',
        tags: ['reservations'],
        body: ReservationRequest,
        response: {
          200: ReservationResponse,
          ...problems({
            ...COMMON_PROBLEMS,
            ...CHECK_PROBLEMS,
            400: ['AGT_ERR_INVALID_RESERVATION', ...CHECK_PROBLEMS[400]],
            503: [...COMMON_PROBLEMS[503], 'AGT_ERR_STORE_UNAVAILABLE'],
          }),
        },
      },
    },
    async (request, reply) => {
      assertServing();
      const { outcome, reservation } = await reservations.reserve(request.body, request.id);
      const body: ReservationResponse = decisionResponse(outcome, legacyHeaders, rateLimitDraft);
      if (reservation !== undefined) body.reservation = reservation;
      return reply.header('x-request-id', request.id).send(body);
    },
  );
  app.post<{ Params: { id: string } }>(
    '/v1/reservations/:id/commit',
    {
      schema: {
        summary: 'Commit the amount used; the rest is refunded (idempotent)',
        tags: ['reservations'],
        params: ReservationParams,
        body: CommitRequest,
        response: { 200: SettlementResponse, ...SETTLE_PROBLEMS },
      },
    },
    async (request): Promise<SettlementResponse> => {
      assertServing();
      const body = CommitRequest.safeParse(request.body);
      if (!body.success) {
        const list = body.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
        throw withProblems(new AgentErrors.AGT_ERR_INVALID_RESERVATION(list.join('; ')), list);
      }
      return reservations.commit(request.params.id, body.data.amount);
    },
  );
  app.delete<{ Params: { id: string } }>(
    '/v1/reservations/:id',
    {
      onRequest: ignoreContentTypeOfBodylessDelete,
      schema: {
        summary: 'Cancel a reservation: everything is refunded (idempotent)',
        tags: ['reservations'],
        params: ReservationParams,
        response: { 200: SettlementResponse, ...SETTLE_PROBLEMS },
      },
    },
    async (request): Promise<SettlementResponse> => {
      assertServing();
      return reservations.cancel(request.params.id);
    },
  );
}
