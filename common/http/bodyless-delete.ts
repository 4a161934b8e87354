/**
 * Some HTTP clients send `Content-Type: application/json` on every request. A DELETE with no body then names a
 * body that is not there, and Fastify's JSON parser refuses it as empty (a 400 whose code says the JSON is
 * malformed): a lease or a policy could not be released or deleted by such a client. With nothing to read, the
 * header is dropped before the body is looked at. The agent hooks its DELETE routes (`onRequest`), sparing its
 * decision routes the call; the coordinator hooks every request.
 */
import type { FastifyInstance, onRequestHookHandler } from 'fastify';

export const ignoreContentTypeOfBodylessDelete: onRequestHookHandler = (request, _reply, done) => {
  const { headers } = request;
  if (
    request.method === 'DELETE' &&
    headers['content-type'] !== undefined &&
    headers['transfer-encoding'] === undefined &&
    (headers['content-length'] === undefined || headers['content-length'] === '0')
  ) {
    delete headers['content-type'];
  }
  done();
};

/** The hook on every request of `app`. */
export function ignoreContentTypeOfBodylessDeletes(app: FastifyInstance): void {
  app.addHook('onRequest', ignoreContentTypeOfBodylessDelete);
}
