/**
 * A Fastify plugin that protects routes with quotaplane policies. A route opts in with
 * `config: { quota: { policy: 'reports', cost?: 1 | (request) => number, subject?: (request) => string } }`
 * (or a list of them, decided all-or-nothing); the plugin asks the agent before the handler runs, forwards the
 * RateLimit headers on every answer, and answers 429 (over quota) or 503 (a fail-closed policy cannot be
 * decided, or the agent is unreachable and the client fails closed) as problem+json.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, preHandlerAsyncHookHandler } from 'fastify';
import fp from 'fastify-plugin';
import type { DecisionResponse } from '../../core/agent-wire.js';
import {
  errorProblem,
  limiterUnavailableProblem,
  quotaExceededProblem,
  sendProblem,
} from '../http/problem.js';
import type { AgentClient } from './agent-client.js';

/** One policy a route is protected by. */
export interface QuotaRule {
  policy: string;
  /** Tokens the request costs (default 1). */
  cost?: number | ((request: FastifyRequest) => number);
  /** The subject, when it differs from the plugin's default. */
  subject?: (request: FastifyRequest) => string | undefined;
}

export interface QuotaPluginOptions {
  client: AgentClient;
  /** Who a request counts against (tenant, account, API key id); undefined answers 400. */
  subject: (request: FastifyRequest) => string | undefined;
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** quotaplane policies protecting this route. */
    quota?: QuotaRule | QuotaRule[];
  }
  interface FastifyInstance {
    /** A preHandler enforcing `rules`, for routes that wire hooks themselves. */
    quota(rules: QuotaRule | QuotaRule[]): preHandlerAsyncHookHandler;
  }
}

const CLOSED_REASONS = new Set(['store_unavailable', 'home_unreachable', 'no_lease', 'agent_unreachable']);

/** Policies a denied decision violated, and whether only unavailability (not quota) denied it. */
export function denialOf(decision: DecisionResponse): { violated: string[]; unavailable: boolean } {
  const violated: string[] = [];
  let quota = false;
  let unavailable = false;
  for (const r of decision.results) {
    if (r.retryAfterMs === 0) continue;
    if (!violated.includes(r.policy)) violated.push(r.policy);
    if (r.reason !== undefined && CLOSED_REASONS.has(r.reason)) unavailable = true;
    else quota = true;
  }
  return { violated, unavailable: unavailable && !quota };
}

function enforce(options: QuotaPluginOptions, rules: QuotaRule[]): preHandlerAsyncHookHandler {
  return async function quotaPreHandler(request: FastifyRequest, reply: FastifyReply) {
    const checks: { policy: string; subject: string; cost?: number }[] = [];
    for (const rule of rules) {
      const subject = rule.subject?.(request) ?? options.subject(request);
      if (subject === undefined || subject === '') {
        return sendProblem(
          reply,
          errorProblem(
            400,
            'AGT_ERR_MISSING_SUBJECT',
            `no subject for policy ${rule.policy} on this request`,
          ),
        );
      }
      const cost = typeof rule.cost === 'function' ? rule.cost(request) : rule.cost;
      checks.push(
        cost === undefined ? { policy: rule.policy, subject } : { policy: rule.policy, subject, cost },
      );
    }
    const decision = await options.client.decide(checks.length === 1 ? checks[0]! : { checks }, {
      requestId: request.id,
    });
    reply.headers(decision.headers);
    if (decision.allowed) return;
    const { violated, unavailable } = denialOf(decision);
    return sendProblem(
      reply,
      unavailable ? limiterUnavailableProblem(violated) : quotaExceededProblem(violated),
    );
  };
}

async function quotaPlugin(fastify: FastifyInstance, options: QuotaPluginOptions): Promise<void> {
  fastify.decorate('quota', (rules: QuotaRule | QuotaRule[]) =>
    enforce(options, Array.isArray(rules) ? rules : [rules]),
  );
  fastify.addHook('onRoute', (route) => {
    const quota = route.config?.quota;
    if (quota === undefined) return;
    const handler = enforce(options, Array.isArray(quota) ? quota : [quota]);
    const existing = route.preHandler;
    route.preHandler =
      existing === undefined ? [handler] : [handler, ...(Array.isArray(existing) ? existing : [existing])];
  });
  return Promise.resolve();
}

/** Register before the routes it protects: `await app.register(quotaplane, { client, subject })`. */
export const quotaplane = fp(quotaPlugin, { name: 'quotaplane', fastify: '5.x' });
