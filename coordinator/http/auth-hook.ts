/**
 * Per-route authentication: a route names the role it needs; the hook checks the bearer token before the body
 * is read. 401 without or with an unknown token (with `WWW-Authenticate`), 403 for a read token that writes.
 */
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction, onRequestHookHandler } from 'fastify';
import type { RefusalReason } from '../../core/wire/admin.js';
import { PolicyName } from '../../core/policy/policy.js';
import type { RefusalRecorder } from '../audit/refusal-recorder.js';
import type { Principal, Role, TokenVerifier } from '../auth/tokens.js';
import { bearerToken, roleAllows } from '../auth/tokens.js';
import { Errors } from '../errors.js';
import type { CoordinatorMetrics } from '../metrics.js';

const REALM = 'quotaplane-coordinator';
const principals = new WeakMap<FastifyRequest, Principal>();

/** The principal an authenticated request acts as. Throws if the route had no auth hook (a wiring bug). */
export function principalOf(request: FastifyRequest): Principal {
  const p = principals.get(request);
  if (p === undefined) throw new Error(`no principal on ${request.method} ${request.url}`);
  return p;
}

/** Build the hooks of one app; refusals go to `refusals` (the audit trail) when given. */
export function authHooks(verifier: TokenVerifier, metrics: CoordinatorMetrics, refusals?: RefusalRecorder) {
  const refuse = (request: FastifyRequest, reason: RefusalReason, principal?: Principal): void => {
    metrics.authFailures.inc({ reason });
    const name = PolicyName.safeParse((request.params as { name?: unknown } | undefined)?.name);
    refusals?.note({
      reason,
      actor: principal ?? { role: 'none', name: reason },
      source: request.ip,
      method: request.method,
      route: request.routeOptions.url ?? 'unmatched',
      policy: name.success ? name.data : undefined,
      requestId: request.id,
    });
  };
  return (required: Role): onRequestHookHandler =>
    function authenticate(request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void {
      const header = request.headers.authorization;
      if (header === undefined) {
        refuse(request, 'missing');
        reply.header('www-authenticate', `Bearer realm="${REALM}"`);
        return done(new Errors.UNAUTHORIZED());
      }
      // Another scheme, or no scheme, counts as a wrong token.
      const token = bearerToken(header);
      const principal = token === undefined ? undefined : verifier.verify(token);
      if (principal === undefined) {
        refuse(request, 'invalid');
        reply.header('www-authenticate', `Bearer realm="${REALM}", error="invalid_token"`);
        return done(new Errors.UNAUTHORIZED());
      }
      if (!roleAllows(principal.role, required)) {
        refuse(request, 'forbidden', principal);
        reply.header('www-authenticate', `Bearer realm="${REALM}", error="insufficient_scope"`);
        return done(new Errors.FORBIDDEN(principal.role, verb(request.method)));
      }
      principals.set(request, principal);
      done();
    };
}

function verb(method: string): string {
  return method === 'DELETE' ? 'delete policies' : 'change policies';
}
