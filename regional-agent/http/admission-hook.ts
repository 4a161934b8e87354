import type { FastifyInstance } from 'fastify';
import { shedError } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import { retryAfterSeconds, type Admission, type AdmissionRoute } from '../resilience/admission.js';
import { errorProblem, sendProblem } from './problem.js';

/**
 * The admission route a route pattern belongs to: every route that reaches the store or the decision path
 * (decisions and their batch, which enters as its first element: batch-route.ts admits the others one by one;
 * local grants, terms, forward-auth, reservations, lease releases, explain). Health, readiness, metrics and docs are not
 * admitted: they must answer while the agent sheds.
 */
export function decisionRoute(url: string | undefined): AdmissionRoute | undefined {
  if (url === undefined) return undefined;
  if (url === '/v1/decisions' || url === '/v1/decisions/batch') return 'http';
  if (url === '/v1/grants' || url === '/v1/grants/return' || url === '/v1/grants/batch') return 'grants';
  if (url === '/v1/terms') return 'terms';
  if (url === '/v1/forward-auth' || url.startsWith('/v1/forward-auth/')) return 'forward_auth';
  if (url === '/v1/reservations' || url.startsWith('/v1/reservations/')) return 'reservations';
  if (url.startsWith('/v1/leases/')) return 'leases';
  if (url === '/v1/explain') return 'explain';
  return undefined;
}

/**
 * One `onRequest` hook for every route `decisionRoute` names: a request the agent cannot take is answered at once, before
 * its body is read or any store call is made, with `503` problem+json `AGT_ERR_OVERLOADED` and `Retry-After`.
 * An admitted request leaves admission when its response is finished or its connection closes.
 */
export function installAdmission(app: FastifyInstance, admission: Admission, metrics: AgentMetrics): void {
  app.addHook('onRequest', (request, reply, done) => {
    const route = decisionRoute(request.routeOptions.url);
    if (route === undefined) {
      done();
      return;
    }
    const entered = admission.enter(route);
    if (typeof entered === 'function') {
      reply.raw.once('close', entered);
      done();
      return;
    }
    const error = shedError(
      'admission',
      entered === 'in_flight' ? 'too many decisions in flight' : 'event loop delay',
    );
    metrics.requestErrors.labels(error.code).inc();
    reply.header('retry-after', retryAfterSeconds(admission.retryAfterMs)).header('x-request-id', request.id);
    void sendProblem(reply, errorProblem(503, error.code, error.message, undefined, error.shed));
  });
}
