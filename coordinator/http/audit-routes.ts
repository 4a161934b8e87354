/** `GET /v1/audit`: the audit trail, newest first, paged with `before`. */
import type { AdminApp } from './admin-app.js';
import type { onRequestHookHandler } from 'fastify';
import { AuditQuery, AuditResponse, Problem } from '../../core/wire/admin.js';
import type { AuditTrail } from '../audit/audit-trail.js';
import type { Role } from '../auth/tokens.js';
import { Errors } from '../errors.js';
import type { CoordinatorMetrics } from '../metrics.js';

export interface AuditRoutesOptions {
  audit: AuditTrail;
  auth: (role: Role) => onRequestHookHandler;
  metrics: CoordinatorMetrics;
}

export function registerAuditRoutes(app: AdminApp, { audit, auth, metrics }: AuditRoutesOptions): void {
  app.get(
    '/v1/audit',
    {
      onRequest: auth('read'),
      schema: {
        summary: 'Read the audit trail',
        description:
          'Every policy change: who (token role and name), what, before, after, when. Newest first; ' +
          "pass `next` as `before` for the next page. `moves=hide` leaves the rebalancer's share moves out and " +
          'counts them in `movesHidden`.',
        tags: ['audit'],
        security: [{ bearerAuth: [] }],
        querystring: AuditQuery,
        response: { 200: AuditResponse, 400: Problem, 401: Problem, 503: Problem },
      },
    },
    async (request) => {
      try {
        return await audit.read(request.query);
      } catch (error) {
        metrics.kvErrors.inc({ op: 'audit_read' });
        request.log.warn({ err: error }, 'audit read failed');
        throw new Errors.STORE_UNAVAILABLE({ cause: error });
      }
    },
  );
}
