import type { FastifyInstance } from 'fastify';
import type { AgentMetrics } from '../observability/metrics.js';
import { AgentErrors } from '../errors.js';
import { z } from 'zod';
import { problems } from './docs.js';
import { errorProblem, sendProblem } from './problem.js';

const tags = ['health'];
const healthz = {
  summary: 'The process answers',
  tags,
  response: { 200: z.object({ status: z.literal('ok') }) },
};
const readyz = {
  summary: 'The agent should get traffic (policies loaded, not draining, lease held)',
  tags,
  response: {
    200: z.looseObject({ status: z.literal('ready') }),
    ...problems({ 503: ['AGT_ERR_NOT_READY'] }),
  },
};
const metricsSchema = {
  summary: 'Prometheus metrics (text exposition format)',
  tags,
  response: { 200: z.string() },
};

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
  app.get('/healthz', { schema: healthz }, (_request, reply) => reply.send({ status: 'ok' }));
  app.get('/readyz', { schema: readyz }, async (request, reply) => {
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
  app.get('/metrics', { schema: metricsSchema }, async (_request, reply) => {
    const text = await metrics.registry.metrics();
    return reply.type(metrics.registry.contentType).send(text);
  });
}
