import type {
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onSendHookHandler,
  RouteShorthandOptions,
} from 'fastify';
import { ForwardAuthProxy, ForwardAuthQuery } from '../../core/wire/agent.js';
import { clientAddressSubject, ipPrefixesOf } from '../../core/subjects/ip-subject.js';
import { ownValue } from '../../core/own-keys.js';
import type { PolicySource } from '../policies/policy-source.js';
import type { DecisionService } from '../decisions/decision-service.js';
import { AgentErrors, LIMITER_UNAVAILABLE, withProblems } from '../errors.js';
import { decisionHeaders, violatedPolicies } from './decision-reply.js';
import type { ForwardAuthTrust } from './forward-auth-trust.js';
import { CHECK_PROBLEMS, COMMON_PROBLEMS, problems } from './docs.js';
import { limiterUnavailableProblem, quotaExceededProblem, sendProblem } from './problem.js';
import { z } from 'zod';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';

const REFUSALS = {
  ...COMMON_PROBLEMS,
  ...CHECK_PROBLEMS,
  400: [
    'AGT_ERR_INVALID_QUERY',
    'AGT_ERR_MISSING_SUBJECT',
    'AGT_ERR_INVALID_SUBJECT',
    'AGT_ERR_UNTRUSTED_PROXY',
    ...CHECK_PROBLEMS[400],
  ],
  429: ['RATE_LIMITED'],
  503: [...COMMON_PROBLEMS[503], 'LIMITER_UNAVAILABLE'],
} as const;
const NO_BODY = z.null();

/** What the docs say of each flavour of forward-auth: its allowed status, its query and its refusals. */
function forwardAuthSchema(proxy: ForwardAuthProxy | 'any') {
  const subject =
    'The subject is the subject header (`QP_SUBJECT_HEADER`) or the client address from X-Forwarded-For ' +
    '(always the client address for a policy whose subjectKind is ip, by its prefixes).';
  const refusals =
    proxy === 'nginx'
      ? {
          403: NO_BODY.describe(
            'refused: nginx passes only 2xx, 401 and 403 on, so every refusal is a 403 whose X-Quota-Status ' +
              'header is the real status and X-Quota-Code the problem code (any code of the generic route); an ' +
              'answer that decided nothing (a 5xx other than LIMITER_UNAVAILABLE) keeps its status, for nginx ' +
              'to apply the route failure mode',
          ),
        }
      : problems(REFUSALS);
  return {
    summary:
      proxy === 'any'
        ? 'Forward-auth for a proxy; `proxy` picks its status conventions (generic by default)'
        : `Forward-auth with ${proxy === 'envoy' ? 'Envoy ext_authz' : proxy} status conventions`,
    description:
      `${subject} The policy and cost come from the query or the X-Quota-Policy and X-Quota-Cost headers.` +
      (proxy === 'envoy' ? ' Any method and any path below it (ext_authz appends the original path).' : ''),
    tags: ['forward-auth'],
    ...(proxy === 'envoy'
      ? {}
      : { querystring: proxy === 'any' ? ForwardAuthQuery : ForwardAuthQuery.omit({ proxy: true }) }),
    response: {
      [proxy === 'envoy' ? 200 : 204]: NO_BODY.describe('allowed: no body; the RateLimit headers'),
      ...refusals,
    },
  };
}

export interface ForwardAuthOptions {
  service: DecisionService;
  /** The policies in force: an `ip` policy's prefixes bucket the client address. */
  policies: PolicySource;
  legacyHeaders: boolean;
  /** Which draft-ietf-httpapi-ratelimit-headers revision the headers follow (default draft-11). */
  rateLimitDraft?: RateLimitDraft | undefined;
  /** Lower-case name of the header carrying the subject. */
  subjectHeader: string;
  /** Refuses (AGT_ERR_UNTRUSTED_PROXY) a request that does not come from a trusted proxy with the secret. */
  trust: ForwardAuthTrust;
  /** Whether an address is a trusted proxy's: such an address is never taken for the client's. */
  trustedAddress: (address: string) => boolean;
  assertServing: () => void;
}

/** Envoy ext_authz's `path_prefix`: what Envoy appends to it (the original path and query) is not the agent's. */
export const ENVOY_FORWARD_AUTH_PATH = '/v1/forward-auth/envoy';

/**
 * The agent's `rewriteUrl`: a request under ENVOY_FORWARD_AUTH_PATH carries the client's method, path and body,
 * none of which forward-auth reads, so it is routed as a GET (a HEAD stays one) of the prefix itself. No method,
 * path or body of the client's can then keep the route from deciding: an unknown method (PROPFIND) or a path that
 * is not valid percent-encoding had no route (404), QUERY without a content type was a 400, a body without one
 * (`with_request_body`) a 415, and Envoy sent each to the client as its denial.
 */
export function envoyForwardAuthUrl(req: { url?: string | undefined; method?: string | undefined }): string {
  const url = req.url ?? '/';
  const prefix = ENVOY_FORWARD_AUTH_PATH;
  if (url !== prefix && !url.startsWith(`${prefix}/`) && !url.startsWith(`${prefix}?`)) return url;
  if (req.method !== 'HEAD') req.method = 'GET';
  return prefix;
}

/** The headers an nginx refusal carries its real status and code in (nginx passes only 401 and 403 on). */
export const NGINX_STATUS_HEADER = 'x-quota-status';
export const NGINX_CODE_HEADER = 'x-quota-code';

/** What the proxy is answered when the request is allowed. */
const ALLOWED_STATUS: Record<ForwardAuthProxy, number> = {
  generic: 204,
  traefik: 204,
  nginx: 204,
  envoy: 200,
};

/**
 * Forward-auth for nginx `auth_request`, Traefik ForwardAuth and Envoy ext_authz (HTTP), each answered in the
 * statuses it understands (`ForwardAuthProxy` in core/wire/agent.ts):
 * - `GET /v1/forward-auth?policy=P&cost=N[&proxy=nginx|traefik|envoy]`;
 * - `GET /v1/forward-auth/nginx?…` and `GET /v1/forward-auth/traefik?…`, the same with the proxy in the path;
 * - any method on `/v1/forward-auth/envoy/<original path>`: Envoy appends the original path and query, which
 *   are not ours, so policy and cost come from the `X-Quota-Policy` and `X-Quota-Cost` headers there.
 * Elsewhere too, the headers stand in for a policy or cost the query does not give. Only trusted proxies are
 * answered. The subject is the trusted subject header; without it (or for a policy whose `subjectKind` is `ip`),
 * the client address from `X-Forwarded-For`, bucketed by the policy's prefixes (IPv4 whole, IPv6 by /64 else).
 * Allowed, over quota and limiter unavailable all carry the rate-limit headers.
 */
export function forwardAuthRoute(app: FastifyInstance, options: ForwardAuthOptions): void {
  const {
    service,
    policies,
    legacyHeaders,
    rateLimitDraft,
    subjectHeader,
    trust,
    trustedAddress,
    assertServing,
  } = options;

  const answer = async (
    request: FastifyRequest,
    reply: FastifyReply,
    proxy: ForwardAuthProxy,
    raw: Record<string, unknown>,
  ): Promise<FastifyReply> => {
    trust(request);
    assertServing();
    const policyHeader = request.headers['x-quota-policy'];
    const costHeader = request.headers['x-quota-cost'];
    if (raw['policy'] === undefined && policyHeader !== undefined) raw['policy'] = policyHeader;
    if (raw['cost'] === undefined && costHeader !== undefined) raw['cost'] = costHeader;
    const query = ForwardAuthQuery.safeParse(raw);
    if (!query.success) {
      const problems = query.error.issues.map((i) => `${i.path.join('.') || 'query'}: ${i.message}`);
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_QUERY(problems.join('; ')), problems);
    }
    const header = ownValue(request.headers, subjectHeader);
    const sent = typeof header === 'string' && header.length > 0 ? header : undefined;
    const policy = policies.current().get(query.data.policy);
    // A proxy is never told a lease and cannot give one back: each slot would be held until the lease ran out.
    if (policy?.kind === 'concurrency') {
      const problem = `policy: ${policy.name} is a concurrency policy, whose slots a proxy cannot give back`;
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_QUERY(problem), [problem]);
    }
    // The peer is a trusted proxy: its X-Forwarded-For names the client (request.ip walks the chain from the
    // right past every trusted hop). Without one, request.ip would be the proxy itself, and every client would
    // share one bucket. An ip policy counts the client address whatever subject header comes with it.
    let subject = sent;
    if (
      request.headers['x-forwarded-for'] !== undefined &&
      (sent === undefined || policy?.subjectKind === 'ip')
    ) {
      // A chain of trusted hops alone (or an empty header) names no client: request.ip is then a proxy's own
      // address, which would put every client in one bucket.
      if (trustedAddress(request.ip)) {
        throw new AgentErrors.AGT_ERR_MISSING_SUBJECT(
          'X-Forwarded-For names no client address beyond the trusted proxies (QP_TRUSTED_PROXIES)',
        );
      }
      subject = clientAddressSubject(request.ip, ipPrefixesOf(policy));
      if (subject === undefined) {
        throw new AgentErrors.AGT_ERR_INVALID_SUBJECT(
          `the client address ${JSON.stringify(request.ip)} from X-Forwarded-For is not an IP address`,
        );
      }
    }
    if (subject === undefined) {
      throw new AgentErrors.AGT_ERR_MISSING_SUBJECT(
        `send the ${subjectHeader} header, or X-Forwarded-For for a quota per client address`,
      );
    }
    const body =
      query.data.cost === undefined
        ? { policy: query.data.policy, subject }
        : { policy: query.data.policy, subject, cost: query.data.cost };
    const outcome = await service.decideBody(body, request.id);
    reply.headers(decisionHeaders(outcome, legacyHeaders, rateLimitDraft)).header('x-request-id', request.id);
    if (outcome.allowed) return reply.code(ALLOWED_STATUS[proxy]).send();
    const violated = violatedPolicies(outcome);
    return sendProblem(
      reply,
      outcome.unavailable ? limiterUnavailableProblem(violated) : quotaExceededProblem(violated),
    );
  };

  /** The route's options: every answer, errors included, leaves in the statuses `proxyOf` understands. */
  const routeOptions = (
    proxyOf: (request: FastifyRequest) => ForwardAuthProxy,
    documented: ForwardAuthProxy | 'any',
  ): RouteShorthandOptions => ({
    onSend: translateFor(proxyOf),
    schema: forwardAuthSchema(documented),
  });

  const fromQuery = (request: FastifyRequest): ForwardAuthProxy => {
    const proxy = ForwardAuthProxy.safeParse(
      (request.query as Record<string, unknown> | undefined)?.['proxy'],
    );
    return proxy.success ? proxy.data : 'generic';
  };
  app.get('/v1/forward-auth', routeOptions(fromQuery, 'any'), (request, reply) =>
    answer(request, reply, fromQuery(request), { ...(request.query as Record<string, unknown>) }),
  );
  for (const proxy of ['nginx', 'traefik'] as const) {
    app.get(
      `/v1/forward-auth/${proxy}`,
      routeOptions(() => proxy, proxy),
      (request, reply) => {
        const { proxy: _ignored, ...query } = request.query as Record<string, unknown>;
        return answer(request, reply, proxy, query);
      },
    );
  }
  for (const path of ['/v1/forward-auth/envoy', '/v1/forward-auth/envoy/*']) {
    app.all(
      path,
      routeOptions(() => 'envoy', 'envoy'),
      (request, reply) => answer(request, reply, 'envoy', {}),
    );
  }
}

/**
 * nginx's `auth_request` turns every status but 2xx, 401 and 403 into a 500 for its client, and drops the body:
 * a refusal leaves as a 403 that names its real status in `X-Quota-Status` and its problem code in
 * `X-Quota-Code` (beside its rate-limit headers), for the proxy's `error_page` to answer with. An answer that
 * decided nothing (shed, not ready, an internal error: a 5xx other than LIMITER_UNAVAILABLE) leaves as it is,
 * which nginx takes as an agent it cannot reach, so the route's `error_page 500` applies its own failure mode.
 * Other proxies get the status itself.
 */
function translateFor(proxyOf: (request: FastifyRequest) => ForwardAuthProxy): onSendHookHandler {
  return (request, reply, payload, done) => {
    const status = reply.statusCode;
    if (status >= 300 && proxyOf(request) === 'nginx') {
      const code = problemCode(payload);
      if (status < 500 || code === LIMITER_UNAVAILABLE) {
        reply.header(NGINX_STATUS_HEADER, String(status)).header(NGINX_CODE_HEADER, code);
        reply.code(403);
      }
    }
    done(null, payload);
  };
}

/** The stable code of a serialized problem document (refusals only, so parsing it again costs little). */
function problemCode(payload: unknown): string {
  if (typeof payload !== 'string') return 'AGT_ERR_INTERNAL';
  try {
    const code = (JSON.parse(payload) as { code?: unknown }).code;
    return typeof code === 'string' && /^[A-Z_]{1,64}$/.test(code) ? code : 'AGT_ERR_INTERNAL';
  } catch {
    return 'AGT_ERR_INTERNAL';
  }
}
