/**
 * An example service protected by quotaplane: exporting a report costs one token of `reports` per tenant
 * (and as many `export-pages` as pages asked for); reading one is free. The tenant comes from `X-Tenant-Id`.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import type { AgentClient } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';

export interface ReportsAppOptions {
  client: AgentClient;
}

export async function buildReportsApp({ client }: ReportsAppOptions): Promise<FastifyInstance> {
  const app = Fastify();
  await app.register(quotaplane, {
    client,
    subject: (request) => {
      const tenant = request.headers['x-tenant-id'];
      return typeof tenant === 'string' ? `tenant:${tenant}` : undefined;
    },
  });

  let next = 1;
  app.post<{ Body: { pages?: number } }>(
    '/reports',
    {
      config: {
        quota: [
          { policy: 'reports' },
          {
            policy: 'export-pages',
            cost: (request) => (request.body as { pages?: number } | undefined)?.pages ?? 1,
          },
        ],
      },
    },
    async (request, reply) => reply.code(201).send({ id: next++, pages: request.body?.pages ?? 1 }),
  );
  app.get<{ Params: { id: string } }>('/reports/:id', (request, reply) =>
    reply.send({ id: Number(request.params.id) }),
  );
  return app;
}
