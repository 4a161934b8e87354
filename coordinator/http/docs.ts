/**
 * The OpenAPI document, generated from the routes' zod schemas (fastify-type-provider-zod + @fastify/swagger),
 * served as JSON at `/docs/json` and as a page at `/docs` (@fastify/swagger-ui, assets bundled in the package).
 * Registered before the routes, so swagger sees each one as it is added.
 */
import fastifySwagger from '@fastify/swagger';
import fastifySwaggerUi from '@fastify/swagger-ui';
import type { FastifyInstance } from 'fastify';
import { createJsonSchemaTransform, createJsonSchemaTransformObject } from 'fastify-type-provider-zod';
import { adminSchemas } from '../../core/wire/admin.js';

export const DOCS_PREFIX = '/docs';

export async function registerDocs(app: FastifyInstance, version: string): Promise<void> {
  await app.register(fastifySwagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'quotaplane coordinator admin API',
        description:
          'Global rate-limit budgets per policy, enforced regionally. Bearer tokens: the admin token (write) ' +
          'may do everything, the read token may only read. Errors are application/problem+json with a ' +
          'stable `code` (docs/errors.md).',
        version,
      },
      components: {
        securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer' } },
      },
      tags: [
        { name: 'policies', description: 'Global budgets' },
        { name: 'allocations', description: 'Shares of each budget per region' },
        { name: 'audit', description: 'Who changed what' },
        { name: 'backup', description: 'Policies and audit trail out, and into an empty coordinator' },
        { name: 'health', description: 'Probes and metrics' },
      ],
    },
    transform: createJsonSchemaTransform({
      skipList: [`${DOCS_PREFIX}/`, `${DOCS_PREFIX}/json`, `${DOCS_PREFIX}/yaml`, `${DOCS_PREFIX}/*`],
      schemaRegistry: adminSchemas,
    }),
    transformObject: createJsonSchemaTransformObject({ schemaRegistry: adminSchemas }),
  });
  await app.register(fastifySwaggerUi, { routePrefix: DOCS_PREFIX });
}
