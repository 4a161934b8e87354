/**
 * A Fastify plugin that protects routes with quotaplane policies. A route opts in with
 * `config: { quota: { policy: 'reports', cost?: 1 | (request) => number, subject?: (request) => string,
 * onUnavailable?: 'closed' | 'open' | 'local' } }` (or a list of them, decided all-or-nothing); the plugin asks
 * the agent before the handler runs, forwards the RateLimit headers on every answer, and answers 429 (over
 * quota) or 503 (the limiter cannot decide and the policy fails closed) as problem+json.
 *
 * The agent's own refusals never reach the end user: a check the agent refuses (an unknown or deleted policy, a
 * cost above the policy's maxCost…) is a configuration error of the service, logged at error level, counted
 * (`client.stats().refused`) and told to `onRefused`, and the request gets the route's failure mode. Only a
 * subject the agent finds invalid is the caller's own fault: 400 `AGT_ERR_INVALID_SUBJECT`, without the agent's
 * message.
 */
import { STATUS_CODES } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest, preHandlerAsyncHookHandler } from 'fastify';
import fp from 'fastify-plugin';
import {
  PROBLEM_CONTENT_TYPE,
  limiterUnavailableProblem,
  problemOf,
  quotaExceededProblem,
  type DecisionCheck,
  type Problem,
} from '../../../core/agent-wire.js';
import { setOwn } from '../../../core/own-keys.js';
import {
  AgentRequestError,
  AgentUnavailableError,
  type AgentClient,
  type Decision,
  type FailureMode,
} from './agent-client.js';

/** One policy a route is protected by. */
export interface QuotaRule {
  policy: string;
  /** Tokens the request costs (default 1). */
  cost?: number | ((request: FastifyRequest) => number);
  /** The subject, when it differs from the plugin's default. */
  subject?: (request: FastifyRequest) => string | undefined;
  /** What this route does when the policy cannot be decided, overriding the plugin's and the client's. */
  onUnavailable?: FailureMode;
}

export interface QuotaPluginOptions {
  client: AgentClient;
  /** Who a request counts against (tenant, account, API key id); undefined answers 400. */
  subject: (request: FastifyRequest) => string | undefined;
  /** Failure mode of routes that name none; default: the client's, per policy. */
  onUnavailable?: FailureMode;
  /**
   * Told when the agent refuses a route's check (unknown or deleted policy, cost above maxCost…): wire it to the
   * service's alerting. The end user gets the route's failure mode, never the agent's message.
   */
  onRefused?: (error: AgentRequestError, request: FastifyRequest) => void;
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
/** Refusals caused by the caller's own input; every other refusal is the service's configuration. */
const CALLER_CODES = new Set(['AGT_ERR_INVALID_SUBJECT']);

/** Policies a denied decision violated, and whether only unavailability (not quota) denied it. */
export function denialOf(decision: Decision): { violated: string[]; unavailable: boolean } {
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

function send(reply: FastifyReply, problem: Problem): FastifyReply {
  return reply.code(problem.status).type(PROBLEM_CONTENT_TYPE).send(problem);
}

function callerProblem(code: string, detail: string): Problem {
  return problemOf(400, STATUS_CODES[400] ?? 'Bad Request', code, detail);
}

function enforce(options: QuotaPluginOptions, rules: QuotaRule[]): preHandlerAsyncHookHandler {
  const modes: Record<string, FailureMode> = {};
  for (const rule of rules) {
    const mode = rule.onUnavailable ?? options.onUnavailable;
    if (mode !== undefined) setOwn(modes, rule.policy, mode);
  }
  return async function quotaPreHandler(request: FastifyRequest, reply: FastifyReply) {
    const checks: DecisionCheck[] = [];
    for (const rule of rules) {
      const subject = rule.subject?.(request) ?? options.subject(request);
      if (subject === undefined || subject === '') {
        return send(reply, callerProblem('AGT_ERR_MISSING_SUBJECT', 'this request names no subject'));
      }
      const cost = typeof rule.cost === 'function' ? rule.cost(request) : rule.cost;
      checks.push(
        cost === undefined ? { policy: rule.policy, subject } : { policy: rule.policy, subject, cost },
      );
    }
    const body = checks.length === 1 ? checks[0]! : { checks };
    let decision: Decision;
    try {
      decision = await options.client.decide(body, { requestId: request.id, onUnavailable: modes });
    } catch (error) {
      if (!(error instanceof AgentRequestError)) throw error;
      if (CALLER_CODES.has(error.code)) {
        return send(reply, callerProblem(error.code, 'the subject of this request is not valid'));
      }
      request.log.error(
        { code: error.code, status: error.status, policies: checks.map((c) => c.policy), reqId: request.id },
        `quotaplane: the agent refused this route's check (${error.code}: ${error.problem.detail ?? error.problem.title}); ` +
          'answering with the route failure mode. Fix the route or the policy.',
      );
      options.onRefused?.(error, request);
      decision = options.client.failureDecision(
        body,
        new AgentUnavailableError('refused', error.message),
        modes,
      );
    }
    reply.headers(decision.headers);
    if (decision.allowed) return;
    const { violated, unavailable } = denialOf(decision);
    return send(reply, unavailable ? limiterUnavailableProblem(violated) : quotaExceededProblem(violated));
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
