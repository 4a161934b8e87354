/** `/healthz` (the process answers), `/readyz` (NATS and the buckets are up, not draining), `/metrics`. */
import type { AdminApp } from './admin-app.js';
import type { onRequestHookHandler } from 'fastify';
import { z } from 'zod';
import { HealthResponse, ReadinessResponse } from '../../core/wire/admin.js';
import type { CoordinatorMetrics } from '../metrics.js';
import type { ReadinessProbe } from '../ports.js';

export interface HealthRoutesOptions {
  readiness: ReadinessProbe;
  metrics: CoordinatorMetrics;
  /** Serve `/metrics` here (false when it has a listener of its own). Default true. */
  serveMetrics?: boolean;
  /** The auth hook `/metrics` needs (`QP_METRICS_AUTH=read`); open without. */
  metricsAuth?: onRequestHookHandler;
}

export function registerHealthRoutes(
  app: AdminApp,
  { readiness, metrics, serveMetrics = true, metricsAuth }: HealthRoutesOptions,
): void {
  app.get(
    '/healthz',
    { schema: { summary: 'Liveness', tags: ['health'], response: { 200: HealthResponse } } },
    () => ({ status: 'ok' as const }),
  );

  app.get(
    '/readyz',
    {
      schema: {
        summary: 'Readiness: NATS connected, KV buckets open, not shutting down',
        tags: ['health'],
        response: { 200: ReadinessResponse, 503: ReadinessResponse },
      },
    },
    (_request, reply) => {
      const reasons = readiness.reasons();
      reply.code(reasons.length === 0 ? 200 : 503);
      return { ready: reasons.length === 0, reasons };
    },
  );

  if (!serveMetrics) return;
  app.get(
    '/metrics',
    {
      ...(metricsAuth !== undefined ? { onRequest: metricsAuth } : {}),
      schema: {
        summary: 'Prometheus metrics',
        tags: ['health'],
        response: { 200: z.string().describe('Prometheus text exposition format') },
      },
    },
    async (_request, reply) => {
      const text = await metrics.registry.metrics();
      return reply.header('content-type', metrics.registry.contentType).send(text);
    },
  );
}
