/**
 * `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the agent's decision service: descriptors
 * become checks by the descriptor rules, `hits_addend` is every check's cost, and the checks of one request are
 * decided together, all-or-nothing, exactly as a layered `POST /v1/decisions` (same buckets, same failure
 * modes, same deadline, bounded further by the call's own deadline). Bad requests and errors are gRPC statuses
 * (`RlsError`), never decisions: Envoy then applies its `failure_mode_deny`.
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import type { DecisionCheck } from '../../core/wire/agent.js';
import { ipPrefixesOf, ipSubject } from '../../core/subjects/ip-subject.js';
import { ownValue } from '../../core/own-keys.js';
import type { PolicySource } from '../policies/policy-source.js';
import { RlsRequest, type RlsResponse } from '../../core/wire/rls.js';
import type { DecisionService } from '../decisions/decision-service.js';
import type { AgentError } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { Admission } from '../resilience/admission.js';
import type { DescriptorRules } from './descriptor-rules.js';
import { rlsResponse } from './rls-response.js';
import type { RateLimitDraft } from '../../core/wire/rate-limit-headers.js';

/** gRPC status codes the service answers with (grpc-js `status`). */
export const GrpcStatus = {
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  INTERNAL: 13,
  UNAVAILABLE: 14,
} as const;
export type GrpcStatusName = keyof typeof GrpcStatus;

/** A request the service does not answer with a decision: its gRPC status and a message for the caller. */
export class RlsError extends Error {
  readonly status: GrpcStatusName;
  /** The agent's stable code behind it, when there is one (`AGT_ERR_UNKNOWN_POLICY`). */
  readonly code: string | undefined;
  constructor(status: GrpcStatusName, message: string, code?: string) {
    super(message);
    this.name = 'RlsError';
    this.status = status;
    this.code = code;
  }
}

/** The gRPC status of each agent error a decision may throw; anything else is INTERNAL. */
const STATUS_OF_CODE: Readonly<Record<string, GrpcStatusName>> = {
  AGT_ERR_INVALID_REQUEST: 'INVALID_ARGUMENT',
  AGT_ERR_TOO_MANY_CHECKS: 'INVALID_ARGUMENT',
  AGT_ERR_INVALID_SUBJECT: 'INVALID_ARGUMENT',
  AGT_ERR_INVALID_COST: 'INVALID_ARGUMENT',
  AGT_ERR_COST_ABOVE_MAX: 'INVALID_ARGUMENT',
  AGT_ERR_MIXED_HOME_REGIONS: 'INVALID_ARGUMENT',
  AGT_ERR_UNKNOWN_POLICY: 'NOT_FOUND',
  AGT_ERR_NOT_READY: 'UNAVAILABLE',
  AGT_ERR_OVERLOADED: 'UNAVAILABLE',
};

export interface RlsServiceDeps {
  service: DecisionService;
  policies: PolicySource;
  rules: DescriptorRules;
  metrics: AgentMetrics;
  log: Logger;
  legacyHeaders: boolean;
  /** Which draft-ietf-httpapi-ratelimit-headers revision the headers follow (default draft-11). */
  rateLimitDraft?: RateLimitDraft | undefined;
  /** Throws AGT_ERR_NOT_READY until policies are known. */
  assertServing: () => void;
  /** Admission control, shared with the HTTP routes: a call the agent cannot take is UNAVAILABLE at once. */
  admission?: Admission | undefined;
}

export interface RlsService {
  /** Decide one request within `deadlineMs` (the call's deadline; Infinity without one). */
  shouldRateLimit(request: unknown, deadlineMs: number): Promise<RlsResponse>;
}

function counter(registry: Registry, name: string, help: string, labelNames: string[]): Counter<string> {
  return (
    (registry.getSingleMetric(name) as Counter<string> | undefined) ??
    new Counter({ name, help, labelNames, registers: [registry] })
  );
}

export function rlsService(deps: RlsServiceDeps): RlsService {
  const { service, rules, metrics, log } = deps;
  const requests = counter(
    metrics.registry,
    'quotaplane_rls_requests_total',
    'ShouldRateLimit calls by outcome (ok, over_limit, or the gRPC status of an error)',
    ['outcome'],
  );
  const descriptors = counter(
    metrics.registry,
    'quotaplane_rls_descriptors_total',
    'Rate-limit descriptors by whether a rule mapped them to a check (unmatched ones are not limited)',
    ['outcome'],
  );

  const refuse = (error: RlsError): never => {
    requests.labels(error.status.toLowerCase()).inc();
    if (error.code !== undefined) metrics.requestErrors.labels(error.code).inc();
    // An unknown policy is the operator's mistake (a rule or an Envoy action naming no policy): say it loudly.
    if (error.status === 'NOT_FOUND')
      log.error({ code: error.code, err: error.message }, 'rate-limit descriptor names no policy');
    throw error;
  };

  async function decide(raw: unknown, deadlineMs: number): Promise<RlsResponse> {
    const parsed = RlsRequest.safeParse(raw);
    if (!parsed.success) {
      const problems = parsed.error.issues.map((i) => `${i.path.join('.') || 'request'}: ${i.message}`);
      return refuse(new RlsError('INVALID_ARGUMENT', `invalid RateLimitRequest: ${problems.join('; ')}`));
    }
    const request = parsed.data;
    if (deadlineMs <= 0)
      return refuse(new RlsError('DEADLINE_EXCEEDED', 'the call deadline passed before it started'));
    deps.assertServing();
    const cost = request.hits_addend === undefined || request.hits_addend === 0 ? 1 : request.hits_addend;
    // Descriptors naming the same bucket are one check charged once per descriptor, as Envoy's own service does.
    const checks: DecisionCheck[] = [];
    const repeats: number[] = [];
    const byBucket = new Map<string, number>();
    const policies = deps.policies.current();
    const prefixesOf = (name: string) => ipPrefixesOf(policies.get(name));
    const toCheck = request.descriptors.map((descriptor, i) => {
      const mapped = rules.map(request.domain, descriptor, prefixesOf);
      if (mapped.kind === 'invalid') {
        return refuse(new RlsError('INVALID_ARGUMENT', `descriptors.${i}: ${mapped.message}`));
      }
      descriptors.labels(mapped.kind === 'check' ? 'matched' : 'unmatched').inc();
      if (mapped.kind === 'unmatched') return undefined;
      const named = policies.get(mapped.policy);
      // Envoy is never told a lease and cannot give one back: each slot would be held until the lease ran out.
      if (named?.kind === 'concurrency') {
        return refuse(
          new RlsError(
            'INVALID_ARGUMENT',
            `descriptors.${i}: ${mapped.policy} is a concurrency policy, whose slots a proxy cannot give back`,
          ),
        );
      }
      // The bucket as the router will key it: an ip policy counts the canonical prefix of the address, so two
      // spellings of one client (or two addresses of one prefix) are one bucket, never a duplicate check.
      const ip = named?.subjectKind === 'ip' ? ipSubject(mapped.subject, ipPrefixesOf(named)) : undefined;
      const id = `${mapped.policy}\u0000${ip?.ok === true ? ip.subject : mapped.subject}`;
      const known = byBucket.get(id);
      if (known !== undefined) {
        checks[known]!.cost = (checks[known]!.cost ?? 1) + cost;
        repeats[known]! += 1;
        return known;
      }
      byBucket.set(id, checks.length);
      checks.push({ policy: mapped.policy, subject: mapped.subject, cost });
      repeats.push(1);
      return checks.length - 1;
    });
    if (checks.length === 0) {
      requests.labels('ok').inc();
      return rlsResponse(toCheck, undefined, policies, deps.legacyHeaders, deps.rateLimitDraft);
    }
    const body = checks.length === 1 ? checks[0]! : { checks };
    // Each descriptor may cost up to maxCost: a bucket named n times may be charged n times that.
    const prepared = service.prepare(service.parse(body), repeats);
    const outcome = await service.decide(prepared, randomUUID(), deadlineMs);
    requests.labels(outcome.allowed ? 'ok' : 'over_limit').inc();
    return rlsResponse(toCheck, outcome, policies, deps.legacyHeaders, deps.rateLimitDraft);
  }

  return {
    async shouldRateLimit(raw, deadlineMs) {
      const entered = deps.admission?.enter('grpc');
      if (typeof entered === 'string') {
        return refuse(
          new RlsError(
            'UNAVAILABLE',
            entered === 'in_flight' ? 'too many decisions in flight' : 'event loop delay',
            'AGT_ERR_OVERLOADED',
          ),
        );
      }
      try {
        return await decide(raw, deadlineMs);
      } catch (error) {
        if (error instanceof RlsError) throw error;
        const code = (error as AgentError).code;
        const status = typeof code === 'string' ? ownValue(STATUS_OF_CODE, code) : undefined;
        if (status !== undefined) return refuse(new RlsError(status, (error as Error).message, code));
        log.error({ err: error }, 'rate-limit request failed');
        return refuse(new RlsError('INTERNAL', 'internal error', 'AGT_ERR_INTERNAL'));
      } finally {
        entered?.();
      }
    },
  };
}
