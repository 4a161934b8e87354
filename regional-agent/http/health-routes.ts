import type { FastifyInstance } from 'fastify';
import type { AgentMetrics } from '../observability/metrics.js';
import { AgentErrors } from '../errors.js';
import { errorProblem, sendProblem } from './problem.js';

export interface Readiness {
  /** Why the agent is not ready; empty when it is. */
  reasons(): string[];
  /** Extra facts for the readiness body (breaker state, policy count). */
  facts(): Record<string, unknown>;
}

/** `/healthz` (the process answers), `/readyz` (it should get traffic), `/metrics` (Prometheus). */
export function healthRoutes(
  app: FastifyInstance,
  options: { readiness: Readiness; metrics: AgentMetrics },
): void {
  const { readiness, metrics } = options;
  app.get('/healthz', (_request, reply) => reply.send({ status: 'ok' }));
  app.get('/readyz', async (request, reply) => {
    const reasons = readiness.reasons();
    if (reasons.length === 0) return { status: 'ready', ...readiness.facts() };
    const error = new AgentErrors.AGT_ERR_NOT_READY(reasons.join('; '));
    metrics.requestErrors.labels(error.code).inc();
    reply.header('x-request-id', request.id);
    return sendProblem(reply, {
      ...errorProblem(503, error.code, error.message, reasons),
      ...readiness.facts(),
    });
  });
  app.get('/metrics', async (_request, reply) => {
    const text = await metrics.registry.metrics();
    return reply.type(metrics.registry.contentType).send(text);
  });
}
