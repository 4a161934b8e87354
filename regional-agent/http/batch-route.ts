import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import {
  BatchRequest,
  BatchResponse,
  MAX_DECISIONS_PER_BATCH,
  type BatchAnswer,
} from '../../core/wire/batch.js';
import type { DecisionService } from '../decisions/decision-service.js';
import { AgentErrors, shedError, withProblems, type AgentError } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { Admission } from '../resilience/admission.js';
import { decisionResponse } from './decision-reply.js';
import { COMMON_PROBLEMS, problems } from './docs.js';
import { errorProblem, errorRetryAfter } from './problem.js';
import { hasOwnKey } from '../../core/own-keys.js';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';

const schema = {
  summary: 'Decide many independent requests in one exchange (what the client coalesces)',
  description:
    '`decisions` holds up to 128 `POST /v1/decisions` bodies. Each is decided on its own (layered checks of one ' +
    'element stay all-or-nothing; elements never depend on each other) and answered on its own, in order: ' +
    '`{ status: 200, body: decision }` or `{ status: 4xx|503, body: problem }`. The elements of one batch reach ' +
    'the store together: one script call per cluster slot. Admission control counts every element; one it ' +
    'cannot take answers 503 `AGT_ERR_OVERLOADED`, the others are decided. A shed element (503 ' +
    "`AGT_ERR_OVERLOADED`, here or at a strict policy's home) carries `retryAfter`: the `Retry-After` " +
    '`POST /v1/decisions` would have sent with it, whole seconds.',
  tags: ['decisions'],
  body: BatchRequest,
  response: {
    200: BatchResponse,
    ...problems({
      ...COMMON_PROBLEMS,
      400: ['AGT_ERR_INVALID_REQUEST', 'AGT_ERR_MALFORMED_JSON', 'AGT_ERR_BATCH_TOO_LARGE'],
      413: ['AGT_ERR_BODY_TOO_LARGE'],
      415: ['AGT_ERR_UNSUPPORTED_MEDIA_TYPE'],
    }),
  },
};

export interface BatchRouteOptions {
  service: DecisionService;
  admission: Admission;
  metrics: AgentMetrics;
  log: Logger;
  legacyHeaders: boolean;
  /** Which draft-ietf-httpapi-ratelimit-headers revision the headers follow (default draft-11). */
  rateLimitDraft?: RateLimitDraft | undefined;
  /** The largest batch body, bytes. */
  bodyLimit: number;
  /** Refuses with AGT_ERR_NOT_READY until policies are known. */
  assertServing: () => void;
}

/** The elements of a batch body; throws AGT_ERR_BATCH_TOO_LARGE or AGT_ERR_INVALID_REQUEST. Changes nothing. */
export function batchElements(body: unknown): unknown[] {
  const decisions =
    typeof body === 'object' && body !== null && !Array.isArray(body)
      ? (body as Record<string, unknown>)['decisions']
      : undefined;
  if (Array.isArray(decisions) && decisions.length > MAX_DECISIONS_PER_BATCH) {
    throw new AgentErrors.AGT_ERR_BATCH_TOO_LARGE(MAX_DECISIONS_PER_BATCH, decisions.length);
  }
  // What BatchRequest accepts, checked by hand (zod would walk and copy every element): an object whose only key
  // is a non-empty `decisions` array. Anything else goes to zod, which says what is wrong.
  if (
    Array.isArray(decisions) &&
    decisions.length >= 1 &&
    hasOwnKey(body as object, 'decisions') &&
    Object.keys(body as object).length === 1
  )
    return decisions as unknown[];
  const parsed = BatchRequest.safeParse(body);
  if (parsed.success) return parsed.data.decisions;
  const list = parsed.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
  throw withProblems(new AgentErrors.AGT_ERR_INVALID_REQUEST(list.join('; ')), list);
}

/**
 * `POST /v1/decisions/batch`: independent decisions in one exchange, each answered with its own status and body.
 * The batch entered admission control as one request (its first element); every further element enters on its
 * own. All elements start in the same event-loop turn, so the store sends them together (one script call per
 * cluster slot, up to the store's batch size).
 */
export function batchRoute(app: FastifyInstance, options: BatchRouteOptions): void {
  const { service, admission, metrics, log, legacyHeaders, rateLimitDraft, assertServing } = options;

  /** An element's error answer, as the error handler answers it on `POST /v1/decisions` (its Retry-After too). */
  const problemOf = (error: unknown, requestId: string): BatchAnswer => {
    const e = error as AgentError;
    const status = e.statusCode ?? 500;
    const known = typeof e.code === 'string' && e.code.startsWith('AGT_ERR_');
    if (!known || (status >= 500 && status !== 503)) {
      log.error({ err: error, reqId: requestId }, 'batch element failed');
      metrics.requestErrors.labels('AGT_ERR_INTERNAL').inc();
      return { status: 500, body: errorProblem(500, 'AGT_ERR_INTERNAL', 'Internal error') };
    }
    metrics.requestErrors.labels(e.code).inc();
    const body = errorProblem(status, e.code, e.message, e.errors, e.shed);
    // A shed element (admission here, or a strict policy's home): the Retry-After its own request would carry.
    const retryAfter = errorRetryAfter(e.code, admission.retryAfterMs);
    return retryAfter === undefined ? { status, body } : { status, retryAfter, body };
  };

  const decideOne = async (element: unknown, requestId: string, first: boolean): Promise<BatchAnswer> => {
    let leave: (() => void) | undefined;
    if (!first) {
      const entered = admission.enter('http');
      if (typeof entered !== 'function') {
        return problemOf(
          shedError(
            'admission',
            entered === 'in_flight' ? 'too many decisions in flight' : 'event loop delay',
          ),
          requestId,
        );
      }
      leave = entered;
    }
    try {
      const outcome = await service.decideBody(element, requestId);
      return { status: 200, body: decisionResponse(outcome, legacyHeaders, rateLimitDraft) };
    } catch (error) {
      return problemOf(error, requestId);
    } finally {
      leave?.();
    }
  };

  app.post('/v1/decisions/batch', { schema, bodyLimit: options.bodyLimit }, async (request, reply) => {
    assertServing();
    const elements = batchElements(request.body);
    const answers = await Promise.all(
      elements.map((element, i) => decideOne(element, `${request.id}.${i}`, i === 0)),
    );
    return reply.header('x-request-id', request.id).send({ answers } satisfies BatchResponse);
  });
}
