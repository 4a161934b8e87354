/**
 * A Fastify plugin that protects routes with quotaplane policies. A route opts in with
 * `config: { quota: { policy: 'reports', cost?: 1 | (request) => number, subject?: (request) => string,
 * class?: 'pro' | (request) => string, onUnavailable?: 'closed' | 'open' | 'local' } }` (or a list of them, decided
 * all-or-nothing, with the plugin's `idempotencyKey` when it reads one from the request); the plugin asks
 * the agent before the handler runs, forwards the RateLimit headers on every answer, and answers 429 (over
 * quota) or 503 (the limiter cannot decide and the policy fails closed) as problem+json.
 *
 * A check the agent refuses is never presented as a limiter outage (no 503, no Retry-After). The caller's own
 * mistakes are a 400: a subject that is not one text of at most 1,024 characters (a query parameter given twice)
 * or that the agent finds invalid (`AGT_ERR_INVALID_SUBJECT`), and a cost computed from the
 * request that is not a valid cost or is above the policy's `maxCost` (`AGT_ERR_INVALID_COST`,
 * `AGT_ERR_COST_ABOVE_MAX`), a class read from the request that the policy does not define
 * (`AGT_ERR_UNKNOWN_CLASS`), and an idempotency key the wire does not take (`INVALID_IDEMPOTENCY_KEY`). Everything
 * else (an unknown or deleted policy, a fixed class the policy lacks, a fixed cost above maxCost…) is the service's
 * configuration: logged at error level, counted (`client.stats().refused`), told
 * to `onRefused`, and answered `500 QUOTA_MISCONFIGURED` naming the problem, whatever the route's failure mode.
 *
 * A 429 body names only the violated policies and why (`reason`: `subject_exhausted`, `share_exhausted`…). A
 * decision the client shed because its own queue was full is answered by the failure mode too; when that denies,
 * it is `503 LIMITER_BUSY`, told apart from `503 LIMITER_UNAVAILABLE` (the agent could not decide).
 */
import { createHash } from 'node:crypto';
import { STATUS_CODES } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest, preHandlerAsyncHookHandler } from 'fastify';
import fp from 'fastify-plugin';
import {
  MAX_WIRE_SUBJECT_LENGTH,
  PROBLEM_CONTENT_TYPE,
  isClassName,
  isIdempotencyKey,
  limiterUnavailableProblem,
  problemOf,
  quotaExceededProblem,
  type DecisionCheck,
  type DecisionRequest,
  type Problem,
} from '../../../core/wire/agent.js';
import { setOwn } from '../../../core/own-keys.js';
import { AgentRequestError, type AgentClient, type Decision, type FailureMode } from './agent-client.js';

/** One policy a route is protected by. */
export interface QuotaRule {
  policy: string;
  /** Tokens the request costs (default 1). */
  cost?: number | ((request: FastifyRequest) => number);
  /** The subject, when it differs from the plugin's default. */
  subject?: (request: FastifyRequest) => string | undefined;
  /** What this route does when the policy cannot be decided, overriding the plugin's and the client's. */
  onUnavailable?: FailureMode;
  /**
   * The subject's class (plan, tier) for a policy with `classes`: fixed, or read from the request (undefined: no
   * class, the policy's `subjects` or its own limits decide). A class the policy does not define is the
   * configuration's 500 when fixed, the caller's `400 AGT_ERR_UNKNOWN_CLASS` when read from the request.
   */
  class?: string | ((request: FastifyRequest) => string | string[] | undefined);
}

export interface QuotaPluginOptions {
  client: AgentClient;
  /** Who a request counts against (tenant, account, API key id); undefined answers 400. */
  subject: (request: FastifyRequest) => string | undefined;
  /** Failure mode of routes that name none; default: the client's, per policy. */
  onUnavailable?: FailureMode;
  /**
   * Told when the agent refuses a route's check because of the service's configuration (unknown or deleted
   * policy, a fixed cost above maxCost…): wire it to the service's alerting. The end user gets
   * `500 QUOTA_MISCONFIGURED` naming the problem.
   */
  onRefused?: (error: AgentRequestError, request: FastifyRequest) => void;
  /**
   * The request's idempotency key, e.g. `(request) => request.headers['idempotency-key']`: a retry with the same key
   * on the same route is answered with the first decision and charged nothing (undefined: no key; layered rules
   * share it; `request.quotaDecision.replayed` tells the handler, which must not do the work again); the key is
   * bound to the route (method and URL pattern), so another route with it is another request; the key on another
   * request of the route is the caller's `409 AGT_ERR_IDEMPOTENCY_CONFLICT`. A key
   * that is not 1 to 256 printable ASCII characters without spaces (or a header given twice) is the caller's
   * `400 INVALID_IDEMPOTENCY_KEY`, and nothing is asked.
   */
  idempotencyKey?: (request: FastifyRequest) => string | string[] | undefined;
}

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * The decision that admitted this request, on routes the plugin protects (undefined elsewhere, and before the
     * plugin's preHandler): `replayed` says a retry with the same idempotency key was answered with the first
     * decision (charged nothing now: the handler should answer as it did the first time, not do the work again),
     * `results[i].lease` the concurrency slots held for it (given back when the response ends).
     */
    quotaDecision?: Decision;
  }
  interface FastifyContextConfig {
    /** quotaplane policies protecting this route. */
    quota?: QuotaRule | QuotaRule[];
  }
  interface FastifyInstance {
    /** A preHandler enforcing `rules`, for routes that wire hooks themselves. */
    quota(rules: QuotaRule | QuotaRule[]): preHandlerAsyncHookHandler;
  }
}

const CLOSED_REASONS = new Set([
  'store_unavailable',
  'home_unreachable',
  'no_lease',
  'agent_unreachable',
  'client_shed',
]);
/** Refusals caused by the caller's own input; every other refusal is the service's configuration. */
const CALLER_CODES = new Set(['AGT_ERR_INVALID_SUBJECT']);
/** Refusals of a cost: the caller's when the route computes the cost from the request, else the configuration's. */
const COST_CODES = new Set(['AGT_ERR_INVALID_COST', 'AGT_ERR_COST_ABOVE_MAX']);
/** The refusal of a class: the caller's when the route reads the class from the request, else the configuration's. */
const UNKNOWN_CLASS = 'AGT_ERR_UNKNOWN_CLASS';
/** The agent's 409 for a key reused on another request (or racing its first call): the caller's, passed on. */
const IDEMPOTENCY_CONFLICT = 'AGT_ERR_IDEMPOTENCY_CONFLICT';
/** Stable code of the plugin's 400 for an idempotency key the wire does not take (the agent is not asked). */
export const INVALID_IDEMPOTENCY_KEY = 'INVALID_IDEMPOTENCY_KEY';

/** Stable code of the plugin's 503 for a decision shed by the client's own full queue (fail-closed policy). */
export const LIMITER_BUSY = 'LIMITER_BUSY';
/** Stable code of the plugin's 500 for a check the agent refused because of the service's configuration. */
export const QUOTA_MISCONFIGURED = 'QUOTA_MISCONFIGURED';

/**
 * Policies a denied decision violated, whether only unavailability (not quota) denied it, whether that was the
 * client's own shed, and the first violated policy's reason.
 */
export function denialOf(decision: Decision): {
  violated: string[];
  unavailable: boolean;
  shed: boolean;
  reason: string | undefined;
} {
  // Over quota and unavailable are told apart: a 429 names only the policies over quota, and why; a policy that
  // could not be decided is not over quota (its reason would say an outage), and is named only when nothing is.
  const quota: string[] = [];
  const closed: string[] = [];
  let quotaReason: string | undefined;
  let closedReason: string | undefined;
  let shed = false;
  for (const r of decision.results) {
    if (r.retryAfterMs === 0) continue;
    if (r.reason !== undefined && CLOSED_REASONS.has(r.reason)) {
      if (!closed.includes(r.policy)) closed.push(r.policy);
      closedReason ??= r.reason;
      if (r.reason === 'client_shed') shed = true;
    } else {
      if (!quota.includes(r.policy)) quota.push(r.policy);
      quotaReason ??= r.reason;
    }
  }
  if (quota.length > 0) return { violated: quota, unavailable: false, shed: false, reason: quotaReason };
  return { violated: closed, unavailable: closed.length > 0, shed, reason: closedReason };
}

/** Most 429 bodies one protected route keeps serialized. */
const MAX_CACHED_REFUSALS = 64;

function send(reply: FastifyReply, problem: Problem): FastifyReply {
  return reply.code(problem.status).type(PROBLEM_CONTENT_TYPE).send(problem);
}

const UNKNOWN_CLASS_DETAIL = 'the class of this request is not one the policy defines';

function callerProblem(code: string, detail: string): Problem {
  return problemOf(400, STATUS_CODES[400] ?? 'Bad Request', code, detail);
}

/** What a refusal says about the route's configuration, in the service's own words. */
function misconfiguration(error: AgentRequestError, policies: readonly string[]): string {
  const named = policies.join(', ');
  switch (error.code) {
    case 'AGT_ERR_UNKNOWN_POLICY':
      return `the rate limiter does not know policy ${named} (deleted, or never created)`;
    case 'AGT_ERR_COST_ABOVE_MAX':
    case 'AGT_ERR_INVALID_COST':
      return `this route's cost for ${named} is not one the policy accepts (${error.code})`;
    case 'AGT_ERR_UNKNOWN_CLASS':
      return `this route names a class that policy ${named} does not define`;
    default:
      return `the rate limiter refused this route's check of ${named} (${error.code})`;
  }
}

// The problems below are completed by assignment, never spread (`{ ...problem, key }`): the same document with
// the same key order, but V8 copies these objects in its slow path (about 2 µs each).

function misconfiguredProblem(error: AgentRequestError, policies: readonly string[]): Problem {
  const problem = problemOf(
    500,
    STATUS_CODES[500] ?? 'Internal Server Error',
    QUOTA_MISCONFIGURED,
    `${misconfiguration(error, policies)}: the service's rate-limit configuration must be fixed; retrying will not help`,
  );
  problem['agent-code'] = error.code;
  return problem;
}

function shedProblem(policies: readonly string[]): Problem {
  const problem = limiterUnavailableProblem(policies);
  problem.code = LIMITER_BUSY;
  problem.detail = `this service has too many rate-limit decisions waiting to decide ${policies.join(', ')} now, and the policy fails closed`;
  return problem;
}

function enforce(options: QuotaPluginOptions, rules: QuotaRule[]): preHandlerAsyncHookHandler {
  const modes: Record<string, FailureMode> = {};
  for (const rule of rules) {
    const mode = rule.onUnavailable ?? options.onUnavailable;
    if (mode !== undefined) setOwn(modes, rule.policy, mode);
  }
  // A 429's body depends only on the violated policies and the reason: each is serialized once (the body of a
  // refusal is most of what a subject held at its limit costs the service).
  const refusals = new Map<string, string>();
  return async function quotaPreHandler(request: FastifyRequest, reply: FastifyReply) {
    const checks: DecisionCheck[] = [];
    let costFromRequest = false;
    let classFromRequest = false;
    for (const rule of rules) {
      const subject: unknown = rule.subject?.(request) ?? options.subject(request);
      if (subject === undefined || subject === null || subject === '') {
        return send(reply, callerProblem('AGT_ERR_MISSING_SUBJECT', 'this request names no subject'));
      }
      // What the caller sent, read by the route: a query parameter given twice is an array, a header may be
      // anything up to the server's limit. Not one text the wire carries: the caller's 400, no call.
      if (typeof subject !== 'string' || subject.length > MAX_WIRE_SUBJECT_LENGTH) {
        return send(
          reply,
          callerProblem('AGT_ERR_INVALID_SUBJECT', 'the subject of this request is not valid'),
        );
      }
      if (typeof rule.cost === 'function') costFromRequest = true;
      const cost = typeof rule.cost === 'function' ? rule.cost(request) : rule.cost;
      const check: DecisionCheck =
        cost === undefined ? { policy: rule.policy, subject } : { policy: rule.policy, subject, cost };
      if (rule.class !== undefined) {
        const named: unknown = typeof rule.class === 'function' ? rule.class(request) : rule.class;
        if (typeof rule.class === 'function') {
          classFromRequest = true;
          // What the caller sent: no policy defines a class of another form (the agent is not asked).
          if (named !== undefined && !isClassName(named)) {
            return send(reply, callerProblem(UNKNOWN_CLASS, UNKNOWN_CLASS_DETAIL));
          }
        }
        if (typeof named === 'string') check.class = named;
      }
      checks.push(check);
    }
    const callerKey: unknown = options.idempotencyKey?.(request);
    if (callerKey !== undefined && !isIdempotencyKey(callerKey)) {
      return send(
        reply,
        callerProblem(
          INVALID_IDEMPOTENCY_KEY,
          'the idempotency key of this request is not 1 to 256 printable ASCII characters without spaces',
        ),
      );
    }
    const idempotencyKey = callerKey === undefined ? undefined : routeKey(request, callerKey);
    const body: DecisionRequest =
      checks.length === 1
        ? idempotencyKey === undefined
          ? checks[0]!
          : { ...checks[0]!, idempotencyKey }
        : idempotencyKey === undefined
          ? { checks }
          : { checks, idempotencyKey };
    let decision: Decision;
    try {
      // Inline when decided in this process with no call (most checks of a busy subject): no promise to wait on.
      const pending = options.client.decideInline(body, { requestId: request.id, onUnavailable: modes });
      decision = pending instanceof Promise ? await pending : pending;
    } catch (error) {
      if (!(error instanceof AgentRequestError)) throw error;
      if (CALLER_CODES.has(error.code)) {
        return send(reply, callerProblem(error.code, 'the subject of this request is not valid'));
      }
      if (idempotencyKey !== undefined && error.code === IDEMPOTENCY_CONFLICT) {
        return send(
          reply,
          problemOf(
            409,
            STATUS_CODES[409] ?? 'Conflict',
            IDEMPOTENCY_CONFLICT,
            'this idempotency key already answers a different request, or one still being decided',
          ),
        );
      }
      if (classFromRequest && error.code === UNKNOWN_CLASS) {
        return send(reply, callerProblem(UNKNOWN_CLASS, UNKNOWN_CLASS_DETAIL));
      }
      // A class read from the request sets the largest cost too (a class's maxCost): its cost refusal is the
      // caller's, not an alert any caller could raise at will.
      if ((costFromRequest || classFromRequest) && COST_CODES.has(error.code)) {
        return send(
          reply,
          callerProblem(
            error.code,
            error.code === 'AGT_ERR_COST_ABOVE_MAX'
              ? 'this request costs more than one request may cost'
              : 'the cost of this request is not valid',
          ),
        );
      }
      const policies = checks.map((c) => c.policy);
      request.log.error(
        { code: error.code, status: error.status, policies, reqId: request.id },
        `quotaplane: the agent refused this route's check (${error.code}: ${error.problem.detail ?? error.problem.title}); ` +
          'answering 500 QUOTA_MISCONFIGURED. Fix the route or the policy.',
      );
      options.onRefused?.(error, request);
      return send(reply, misconfiguredProblem(error, policies));
    }
    reply.headers(decision.headers);
    if (decision.allowed) {
      request.quotaDecision = decision;
      hold(request, reply, options.client, decision);
      return;
    }
    const { violated, unavailable, shed, reason } = denialOf(decision);
    if (shed) return send(reply, shedProblem(violated));
    if (unavailable) return send(reply, limiterUnavailableProblem(violated));
    const key = reason === undefined ? violated.join('\n') : `${violated.join('\n')}\n\n${reason}`;
    let refusal = refusals.get(key);
    if (refusal === undefined) {
      const problem = quotaExceededProblem(violated);
      if (reason !== undefined) problem['reason'] = reason;
      refusal = JSON.stringify(problem);
      // Policies and reasons are the routes' and the agent's few; a flood of others only stops the caching.
      if (refusals.size < MAX_CACHED_REFUSALS) refusals.set(key, refusal);
    }
    return reply.code(429).type(PROBLEM_CONTENT_TYPE).send(refusal);
  };
}

/**
 * Give back the concurrency slots `decision` took for `request` when its response ends: sent, failed in the handler
 * (the error handler's answer is sent too), timed out, or abandoned by its caller (the response's `close` comes in
 * every case). Not waited for: an agent slow to answer never delays the service. A request without a slot pays
 * nothing. A replayed decision's leases are its first request's, which gives them back itself (giving them back
 * here would free a slot that request still uses). Unreleased, each slot stayed held for the policy's leaseSeconds
 * after every request, so "N at once" meant "N per leaseSeconds".
 */
function hold(request: FastifyRequest, reply: FastifyReply, client: AgentClient, decision: Decision): void {
  if (decision.replayed === true) return;
  let leases: string[] | undefined;
  for (const r of decision.results) if (r.lease !== undefined) (leases ??= []).push(r.lease);
  if (leases === undefined) return;
  const slots = leases;
  reply.raw.once('close', () => {
    for (const lease of slots) {
      client.releaseLease(lease).catch((error: unknown) => {
        request.log.warn(
          { err: error, reqId: request.id },
          'quotaplane: a concurrency slot could not be given back; it comes back after its leaseSeconds',
        );
      });
    }
  });
}

/**
 * The caller's idempotency key, bound to the route (method and URL pattern): one key sent to two routes is two
 * requests, never one replayed for the other (a handler that runs for a replay would run a route's work on
 * another's admission). 43 base64url characters, a key the wire takes.
 */
function routeKey(request: FastifyRequest, key: string): string {
  const route = request.routeOptions.url ?? request.url;
  return createHash('sha256').update(`${request.method} ${route}\n${key}`).digest('base64url');
}

async function quotaPlugin(fastify: FastifyInstance, options: QuotaPluginOptions): Promise<void> {
  fastify.decorateRequest('quotaDecision', undefined);
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
