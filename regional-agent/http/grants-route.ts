/**
 * Local grants (docs/agent.md, "Local grants"): `POST /v1/grants` takes a small allowance of one subject's tokens
 * out of its bucket in this region (`lua/grant.lua`, as a lend between regions takes them: they leave the bucket
 * before the client spends them, nothing is minted), and `POST /v1/grants/return` hands back what the client did
 * not spend. A return is bound to its take: the take records the grant under a random id the agent draws (in the
 * bucket's slot, for GRANT_RECORD_TTL_MS), the return names it and is credited at most what that grant took, once;
 * an unknown, expired or already returned id credits nothing and answers 404 `AGT_ERR_UNKNOWN_GRANT`. A client
 * that crashes loses its grant's tokens (fewer admissions, never more). One grant takes at most a tenth of the
 * bucket (core/models/grant.ts grantCeiling).
 *
 * Only token buckets decided here give grants: a strict policy, a counter kind (sliding log, concurrency, daily),
 * a sharded policy or one with a subject-creation cap answers 400 `AGT_ERR_GRANT_NOT_ALLOWED`, and the client
 * decides each request at the agent. A subject this region cannot decide now (no lease) gets nothing.
 *
 * `POST /v1/grants/batch` carries many takes and returns in one exchange (the client sends the ones of one
 * event-loop turn together): each item is answered as its single route would answer it, in order, and all start
 * in the same turn, so the grant store sends them to Redis together (one script call per cluster slot; returns
 * first, then takes). A malformed body is refused whole before anything is taken or returned.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { transferBucket } from '../../core/models/transfer.js';
import {
  GrantBatchRequest,
  GrantBatchResponse,
  GrantRequest,
  GrantResponse,
  GrantReturnRequest,
  GrantReturnResponse,
} from '../../core/wire/grant.js';
import type { Problem } from '../../core/wire/agent.js';
import { GRANT_TTL_MS, grantCeiling, grantRecordTtl } from '../../core/models/grant.js';
import { grantRecordKey } from '../../core/keys.js';
import { kindOf } from '../../core/kinds/index.js';
import type { ShareView } from '../../core/shares/shares.js';
import { MICRO } from '../../core/models/token-bucket.js';
import type { DecisionService } from '../decisions/decision-service.js';
import type { PreparedCheck } from '../decisions/prepared.js';
import { AgentErrors, withProblems, type AgentError } from '../errors.js';
import type { GrantStore } from '../grants/grant-store.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import { COMMON_PROBLEMS, problems } from './docs.js';
import { errorProblem } from './problem.js';

export interface GrantsRouteOptions {
  service: DecisionService;
  store: GrantStore;
  guard: StoreGuard;
  shares: ShareView;
  metrics: AgentMetrics;
  assertServing: () => void;
}

const refusals = {
  ...COMMON_PROBLEMS,
  400: [
    'AGT_ERR_INVALID_GRANT',
    'AGT_ERR_GRANT_NOT_ALLOWED',
    'AGT_ERR_INVALID_SUBJECT',
    'AGT_ERR_UNKNOWN_CLASS',
  ],
  404: ['AGT_ERR_UNKNOWN_POLICY', 'AGT_ERR_UNKNOWN_GRANT'],
  503: [...COMMON_PROBLEMS[503], 'AGT_ERR_STORE_UNAVAILABLE'],
} as const;

function parse<T>(
  schema: {
    safeParse(
      v: unknown,
    ):
      | { success: true; data: T }
      | { success: false; error: { issues: { path: PropertyKey[]; message: string }[] } };
  },
  body: unknown,
): T {
  const parsed = schema.safeParse(body);
  if (parsed.success) return parsed.data;
  const list = parsed.error.issues.map((i) => `${i.path.map(String).join('.') || 'body'}: ${i.message}`);
  throw withProblems(new AgentErrors.AGT_ERR_INVALID_GRANT(list.join('; ')), list);
}

/** Why `check` may not be granted (undefined: it may), as the refusal's detail. */
export function grantRefusal(check: PreparedCheck): string | undefined {
  const { policy } = check;
  if (policy.mode === 'strict') return 'a strict policy is decided by its home region, request by request';
  if (!kindOf(policy.kind).grants)
    return `a ${policy.kind.replace('_', ' ')} policy counts every request at the store`;
  if (policy.shards !== undefined) return 'a sharded policy decides on a random sub-bucket per request';
  if (check.route === 'store' && check.bucket.mustExist === true)
    return 'a policy with a subject-creation cap decides new subjects at the store';
  return undefined;
}

/** The subject's bucket here, or why there is none to grant from (throws the 4xx). */
function grantCheck(
  options: Pick<GrantsRouteOptions, 'service' | 'metrics'>,
  body: { policy: string; subject: string; class?: string | undefined },
): PreparedCheck {
  const { service, metrics } = options;
  const [prepared] = service.prepare({
    policy: body.policy,
    subject: body.subject,
    ...(body.class === undefined ? {} : { class: body.class }),
  }).checks;
  if (prepared === undefined) throw new AgentErrors.AGT_ERR_INVALID_GRANT('no check');
  const refusal = grantRefusal(prepared);
  if (refusal !== undefined) {
    metrics.grants.labels(prepared.policy.name, 'refused').inc();
    throw new AgentErrors.AGT_ERR_GRANT_NOT_ALLOWED(prepared.policy.name, refusal);
  }
  return prepared;
}

/**
 * `POST /v1/grants` without HTTP: take up to the amount asked out of the subject's bucket here. Throws the
 * route's 4xx and 503 errors. The conservation property suite runs it on the models (test/helpers/model-world.ts).
 */
export async function takeGrant(
  options: Omit<GrantsRouteOptions, 'assertServing'>,
  input: unknown,
): Promise<GrantResponse> {
  return takeParsed(options, parse(GrantRequest, input));
}

async function takeParsed(
  options: Omit<GrantsRouteOptions, 'assertServing'>,
  body: GrantRequest,
): Promise<GrantResponse> {
  const { store, guard, shares, metrics } = options;
  const check = grantCheck(options, body);
  const ttlMs = body.ttlMs ?? GRANT_TTL_MS;
  const policy = check.policy.name;
  if (check.route !== 'store') {
    // No lease for this region (or no way to decide here now): nothing to take; the client asks per request.
    metrics.grants.labels(policy, 'dry').inc();
    return {
      policy,
      granted: 0,
      limit: 0,
      remaining: 0,
      refillMs: null,
      expiresInMs: ttlMs,
      grant: null,
      maxCost: check.policy.maxCost,
    };
  }
  const { cost: _cost, ...bucket } = check.bucket;
  const encoded = transferBucket(bucket);
  const limit = Math.floor(encoded.capacity / MICRO);
  const amount = Math.min(body.amount, grantCeiling(limit));
  // The grant's id: 16 random bytes, so a return can only name a grant its caller was given.
  const id = randomBytes(16).toString('base64url');
  const leave = shares.enter(policy);
  try {
    const result = await guard.run('grant', () =>
      store.take({
        key: bucket.key,
        record: grantRecordKey(bucket.key, id),
        bucket: encoded,
        amount: amount * MICRO,
        recordTtlMs: grantRecordTtl(ttlMs),
      }),
    );
    metrics.grants.labels(policy, result.granted > 0 ? 'granted' : 'dry').inc();
    if (result.granted > 0) metrics.grantTokens.labels(policy, 'taken').inc(result.granted / MICRO);
    return {
      policy,
      granted: result.granted / MICRO,
      limit,
      remaining: Math.max(0, Math.floor(result.remaining / MICRO)),
      refillMs: result.refillMs < 0 ? null : result.refillMs,
      expiresInMs: ttlMs,
      grant: result.granted > 0 ? id : null,
      maxCost: check.policy.maxCost,
    };
  } catch (error) {
    metrics.grants.labels(policy, 'failed').inc();
    throw new AgentErrors.AGT_ERR_STORE_UNAVAILABLE(error instanceof Error ? error.name : 'no answer');
  } finally {
    leave();
  }
}

/**
 * `POST /v1/grants/return` without HTTP: hand back tokens of grant `grant` (at most what it took, once; what fits
 * under the ceiling). Throws 404 AGT_ERR_UNKNOWN_GRANT for a grant never taken here, expired or already returned.
 */
export async function returnGrant(
  options: Omit<GrantsRouteOptions, 'assertServing'>,
  input: unknown,
): Promise<GrantReturnResponse> {
  return returnParsed(options, parse(GrantReturnRequest, input));
}

async function returnParsed(
  options: Omit<GrantsRouteOptions, 'assertServing'>,
  body: GrantReturnRequest,
): Promise<GrantReturnResponse> {
  const { store, guard, metrics } = options;
  const check = grantCheck(options, body);
  const policy = check.policy.name;
  if (check.route !== 'store') {
    metrics.grantTokens.labels(policy, 'dropped').inc(body.amount);
    return { policy, credited: 0, dropped: body.amount };
  }
  const { cost: _cost, ...bucket } = check.bucket;
  const amount = Math.round(body.amount * MICRO);
  let result;
  try {
    result = await guard.run('grant', () =>
      store.giveBack({
        key: bucket.key,
        record: grantRecordKey(bucket.key, body.grant),
        bucket: transferBucket(bucket),
        amount,
      }),
    );
  } catch (error) {
    metrics.grants.labels(policy, 'failed').inc();
    throw new AgentErrors.AGT_ERR_STORE_UNAVAILABLE(error instanceof Error ? error.name : 'no answer');
  }
  if (!result.known) {
    metrics.grants.labels(policy, 'unknown').inc();
    throw new AgentErrors.AGT_ERR_UNKNOWN_GRANT(body.grant);
  }
  metrics.grants.labels(policy, 'returned').inc();
  if (result.credited > 0) metrics.grantTokens.labels(policy, 'returned').inc(result.credited / MICRO);
  if (result.dropped > 0) metrics.grantTokens.labels(policy, 'dropped').inc(result.dropped / MICRO);
  return { policy, credited: result.credited / MICRO, dropped: result.dropped / MICRO };
}

/**
 * `POST /v1/grants/batch` without HTTP: every return, then every take, started in this turn (the grant store
 * sends them to Redis together), each answered as its single route would be. Throws 400 AGT_ERR_INVALID_GRANT for
 * a malformed body, before anything is taken or returned.
 */
export async function grantBatch(
  options: Omit<GrantsRouteOptions, 'assertServing'>,
  input: unknown,
): Promise<GrantBatchResponse> {
  const body = parse(GrantBatchRequest, input);
  const returns = (body.returns ?? []).map((r) => answer(options, () => returnParsed(options, r)));
  const takes = (body.takes ?? []).map((t) => answer(options, () => takeParsed(options, t)));
  return { takes: await Promise.all(takes), returns: await Promise.all(returns) };
}

/** One item's answer: `{status: 200, body}`, or its refusal's status and problem (never thrown). */
async function answer<T>(
  options: Pick<GrantsRouteOptions, 'metrics'>,
  run: () => Promise<T>,
): Promise<{ status: 200; body: T } | { status: number; body: Problem }> {
  try {
    return { status: 200, body: await run() };
  } catch (error) {
    const e = error as AgentError;
    const status = e.statusCode ?? 500;
    if (typeof e.code !== 'string' || !e.code.startsWith('AGT_ERR_') || (status >= 500 && status !== 503)) {
      options.metrics.requestErrors.labels('AGT_ERR_INTERNAL').inc();
      return { status: 500, body: errorProblem(500, 'AGT_ERR_INTERNAL', 'Internal error') };
    }
    options.metrics.requestErrors.labels(e.code).inc();
    return { status, body: errorProblem(status, e.code, e.message, e.errors) };
  }
}

export function grantsRoute(app: FastifyInstance, options: GrantsRouteOptions): void {
  const { assertServing } = options;

  app.post(
    '/v1/grants',
    {
      schema: {
        summary: "Take a small allowance of one subject's tokens to decide in the client's process",
        description:
          'The tokens leave the bucket now; spend them within `expiresInMs`, then hand the rest back ' +
          '(`POST /v1/grants/return`). At most a tenth of the bucket per grant; 0 when it is empty or this ' +
          'region cannot decide the subject now.',
        tags: ['grants'],
        body: GrantRequest,
        response: { 200: GrantResponse, ...problems(refusals) },
      },
    },
    async (request, reply) => {
      assertServing();
      return reply.send(await takeGrant(options, request.body));
    },
  );

  app.post(
    '/v1/grants/return',
    {
      schema: {
        summary: 'Hand back the tokens of a grant that were not spent',
        description:
          "What fits under the bucket's capacity is put back; the rest (the bucket refilled meanwhile) is " +
          'dropped, never minted.',
        tags: ['grants'],
        body: GrantReturnRequest,
        response: { 200: GrantReturnResponse, ...problems(refusals) },
      },
    },
    async (request, reply) => {
      assertServing();
      return reply.send(await returnGrant(options, request.body));
    },
  );

  app.post(
    '/v1/grants/batch',
    {
      schema: {
        summary: 'Take and hand back grants of many subjects in one exchange (what the client sends)',
        description:
          '`takes` holds `POST /v1/grants` bodies and `returns` `POST /v1/grants/return` bodies (together 1 to ' +
          '128). The returns are handed back first, then the takes taken, each in order and answered on its own, ' +
          'in order: `{ status: 200, body }` or `{ status: 4xx|503, body: problem }`; one refusal never fails ' +
          'another. They reach the store together: one script call per cluster slot. A body that does not match ' +
          'its schema is refused whole (400 `AGT_ERR_INVALID_GRANT`): nothing is taken or returned.',
        tags: ['grants'],
        body: GrantBatchRequest,
        response: {
          200: GrantBatchResponse,
          ...problems({ ...COMMON_PROBLEMS, 400: ['AGT_ERR_INVALID_GRANT'] }),
        },
      },
    },
    async (request, reply) => {
      assertServing();
      return reply.send(await grantBatch(options, request.body));
    },
  );
}
