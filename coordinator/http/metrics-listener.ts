/**
 * `/metrics` on a listener of its own (`QP_METRICS_PORT`), so Prometheus can scrape on an internal address while
 * the admin API listens elsewhere; with `QP_METRICS_AUTH=read` it still wants a read (or write) token.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { TokenVerifier } from '../auth/tokens.js';
import type { CoordinatorConfig } from '../config.js';
import type { CoordinatorMetrics } from '../metrics.js';
import { authHooks } from './auth-hook.js';
import { problemHandler } from './problem.js';

export async function startMetricsListener(
  config: Pick<CoordinatorConfig, 'tokens' | 'metricsAuth' | 'bodyLimitBytes'> & {
    metricsListener: { host: string; port: number };
  },
  metrics: CoordinatorMetrics,
): Promise<{ app: FastifyInstance; url: string }> {
  const app = Fastify({ logger: false });
  app.setErrorHandler(problemHandler(metrics, config.bodyLimitBytes));
  const auth =
    config.metricsAuth === 'read' ? authHooks(new TokenVerifier(config.tokens), metrics)('read') : undefined;
  app.get('/metrics', auth === undefined ? {} : { onRequest: auth }, async (_request, reply) => {
    const text = await metrics.registry.metrics();
    return reply.header('content-type', metrics.registry.contentType).send(text);
  });
  const url = await app.listen({ host: config.metricsListener.host, port: config.metricsListener.port });
  return { app, url };
}
