/**
 * The agent's OpenAPI document, served as JSON at `/docs/json` and as a page at `/docs` (@fastify/swagger and
 * @fastify/swagger-ui, as the coordinator does). It is generated from the zod schemas of core/wire/agent.ts that
 * the routes validate with, attached to each route with the stable codes each status can carry.
 *
 * The agent's routes validate in their handlers (the decision path's hand-written check is held equal to the
 * zod schema by a property test, so valid requests skip zod), so the schemas attached here document and never
 * validate or serialize: the app's compilers pass values through unchanged, and the hot path costs what it did.
 */
import fastifySwagger from '@fastify/swagger';
import fastifySwaggerUi from '@fastify/swagger-ui';
import type { FastifyInstance } from 'fastify';
import { createJsonSchemaTransform, createJsonSchemaTransformObject } from 'fastify-type-provider-zod';
import { z } from 'zod';
import {
  DecisionRequest,
  DecisionResponse,
  ExplainResponse,
  Problem,
  type LIMITER_UNAVAILABLE,
  type RATE_LIMITED,
} from '../../core/wire/agent.js';
import { AGENT_CODES, type AgentErrorCode } from '../errors.js';

export const DOCS_PREFIX = '/docs';
const VERSION = '0.1.0';

/** Schemas the document names as components (`#/components/schemas/<id>`). */
export const agentSchemas = z.registry<{ id: string }>();
agentSchemas.add(DecisionRequest, { id: 'DecisionRequest' });
agentSchemas.add(DecisionResponse, { id: 'DecisionResponse' });
agentSchemas.add(ExplainResponse, { id: 'ExplainResponse' });

type Code = AgentErrorCode | typeof RATE_LIMITED | typeof LIMITER_UNAVAILABLE;

/** The problem documents of each status a route answers with, each listing the stable codes it can carry. */
export function problems(
  byStatus: Readonly<Partial<Record<number, readonly Code[]>>>,
): Record<number, z.ZodType> {
  const out: Record<number, z.ZodType> = {};
  for (const [status, codes] of Object.entries(byStatus)) {
    if (codes === undefined || codes.length === 0) continue;
    out[Number(status)] = Problem.extend({ code: z.enum(codes as [Code, ...Code[]]) }).describe(
      `application/problem+json; code: ${codes.join(', ')} (docs/errors.md)`,
    );
  }
  return out;
}

/** Answers any route may give: not ready yet, shed by admission control, an internal error. */
export const COMMON_PROBLEMS = {
  500: ['AGT_ERR_INTERNAL'],
  503: ['AGT_ERR_NOT_READY', 'AGT_ERR_OVERLOADED'],
} as const satisfies Record<number, readonly Code[]>;

/** Checks a decision (or a forward-auth check) is refused for. */
export const CHECK_PROBLEMS = {
  400: [
    'AGT_ERR_INVALID_SUBJECT',
    'AGT_ERR_INVALID_COST',
    'AGT_ERR_COST_ABOVE_MAX',
    'AGT_ERR_DUPLICATE_CHECK',
    'AGT_ERR_MIXED_HOME_REGIONS',
    'AGT_ERR_UNKNOWN_CLASS',
  ],
  404: ['AGT_ERR_UNKNOWN_POLICY'],
} as const satisfies Record<number, readonly Code[]>;

/**
 * Register the document and the page, and make the app's schemas documentation only. Register before the
 * routes, and add the routes in a plugin registered after it, so swagger sees each one.
 */
export function registerDocs(app: FastifyInstance): void {
  app.setValidatorCompiler(() => (value: unknown) => ({ value }));
  app.setSerializerCompiler(() => (value) => JSON.stringify(value));
  void app.register(fastifySwagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'quotaplane regional agent',
        description:
          'Rate-limit decisions for the services and proxies of one region. Errors are application/problem+json ' +
          'with a stable `code` (docs/errors.md); a route that does not exist answers 404 `AGT_ERR_NOT_FOUND`. ' +
          `Every code: ${AGENT_CODES.join(', ')}.`,
        version: VERSION,
      },
      tags: [
        { name: 'decisions', description: 'Decisions for services' },
        { name: 'forward-auth', description: 'Decisions for proxies (nginx, Traefik, Envoy ext_authz)' },
        { name: 'explain', description: 'Why a subject would be admitted or refused (a dry run)' },
        {
          name: 'terms',
          description:
            "Direct decisions: a short term to decide a token bucket's checks in the client, on this Redis",
        },
        { name: 'health', description: 'Probes and metrics' },
      ],
    },
    transform: createJsonSchemaTransform({
      skipList: [
        `${DOCS_PREFIX}/`,
        `${DOCS_PREFIX}/json`,
        `${DOCS_PREFIX}/yaml`,
        `${DOCS_PREFIX}/*`,
        DOCS_PREFIX,
      ],
      schemaRegistry: agentSchemas,
    }),
    transformObject: createJsonSchemaTransformObject({ schemaRegistry: agentSchemas }),
  });
  void app.register(fastifySwaggerUi, { routePrefix: DOCS_PREFIX });
}
