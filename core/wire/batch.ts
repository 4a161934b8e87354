/**
 * `POST /v1/decisions/batch`: many independent decision requests in one HTTP exchange, as the client coalesces
 * the decisions of one event-loop turn. Each element is a `POST /v1/decisions` body, decided on its own
 * (layered checks of one element stay all-or-nothing) and answered on its own: a 200 decision or a 4xx/503
 * problem (with the `Retry-After` of a shed as `retryAfter`), in the order asked. Shared by the agent and the
 * client.
 */
import { z } from 'zod';
import { DecisionResponse, Problem } from './agent.js';

/** Most decision requests one batch may carry. */
export const MAX_DECISIONS_PER_BATCH = 128;

/** The body of `POST /v1/decisions/batch`: `decisions` holds `POST /v1/decisions` bodies. */
export const BatchRequest = z.strictObject({
  decisions: z.array(z.unknown()).min(1).max(MAX_DECISIONS_PER_BATCH),
});
export type BatchRequest = z.infer<typeof BatchRequest>;

/**
 * One element's answer: the status `POST /v1/decisions` would have answered it with, and that body; a shed
 * element (503 `AGT_ERR_OVERLOADED`) also carries the `Retry-After` that route would have sent (`retryAfter`).
 */
export const BatchAnswer = z.union([
  z.object({ status: z.literal(200), body: DecisionResponse }),
  z.object({
    status: z.number().int().min(400).max(599),
    /**
     * When to ask again, whole seconds: the `Retry-After` header `POST /v1/decisions` would have carried with
     * this answer (a shed's, QP_OVERLOAD_RETRY_AFTER_MS rounded up); absent when it would carry none.
     */
    retryAfter: z.number().int().min(1).optional(),
    body: Problem,
  }),
]);
export type BatchAnswer = z.infer<typeof BatchAnswer>;

/** The answer of `POST /v1/decisions/batch` (200 whenever the batch itself was well formed). */
export const BatchResponse = z.object({ answers: z.array(BatchAnswer) });
export type BatchResponse = z.infer<typeof BatchResponse>;
