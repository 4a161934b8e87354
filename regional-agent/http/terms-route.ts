/**
 * `POST /v1/terms` (docs/agent.md, "Terms"): a short term of one token-bucket policy for a client trusted with this
 * region's Redis, which then decides the policy's single checks itself until the term runs out. The rules are
 * regional-agent/terms/term-issuer.ts; the wire is core/wire/term.ts.
 */
import type { FastifyInstance } from 'fastify';
import { TermRequest, TermResponse } from '../../core/wire/term.js';
import { issueTerm, type TermIssuerOptions } from '../terms/term-issuer.js';
import { COMMON_PROBLEMS, problems } from './docs.js';

export interface TermsRouteOptions extends TermIssuerOptions {
  assertServing: () => void;
  /** The largest body, bytes: a renewal carries up to MAX_TERM_USAGE subjects' usage. */
  bodyLimit: number;
}

const refusals = {
  ...COMMON_PROBLEMS,
  400: ['AGT_ERR_INVALID_TERM', 'AGT_ERR_TERM_NOT_ALLOWED', 'AGT_ERR_INVALID_SUBJECT'],
  404: ['AGT_ERR_UNKNOWN_POLICY', 'AGT_ERR_TERMS_OFF'],
  503: [...COMMON_PROBLEMS[503], 'AGT_ERR_TERM_UNAVAILABLE'],
} as const;

export function termsRoute(app: FastifyInstance, options: TermsRouteOptions): void {
  const { assertServing } = options;
  app.post(
    '/v1/terms',
    {
      schema: {
        summary:
          "A short term to decide one token-bucket policy's single checks in the client, on this Redis",
        description:
          'The client runs `scriptSha` (lua/token_bucket.lua) on `rl:v<version>:{<subject>}:<policy>` with ' +
          '`bucket` and `deadlineMicros` for every check of a subject not in `exclude`, for `validForMs` after it ' +
          'sent this request; tokens it took ahead and did not spend it hands back with `refundSha` ' +
          '(lua/refund.lua). `usage` reports what the previous term decided: it is counted once the request is ' +
          'valid and the policy gives terms, whether or not a term is given now, so never send it twice. 400 ' +
          '`AGT_ERR_TERM_NOT_ALLOWED`: the policy gives none (decide it at the agent); 503 ' +
          '`AGT_ERR_TERM_UNAVAILABLE`: none now (no lease, a lease about to end, no Redis TIME sample, its end ' +
          'not recorded in Redis); 404 ' +
          '`AGT_ERR_TERMS_OFF`: the agent gives none.',
        tags: ['terms'],
        body: TermRequest,
        response: { 200: TermResponse, ...problems(refusals) },
      },
      bodyLimit: options.bodyLimit,
    },
    async (request, reply) => {
      if (options.terms === 'on') assertServing();
      return reply.send(await issueTerm(options, request.body));
    },
  );
}
