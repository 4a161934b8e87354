/**
 * `/v1/policies`: create, replace, read, list, delete and budget changes, with ETags and conditional requests.
 */
import type { AdminApp } from './admin-app.js';
import type { FastifyRequest, onRequestHookHandler } from 'fastify';
import { z } from 'zod';
import {
  BudgetPatch,
  PolicyList,
  PolicyParams,
  PolicyView,
  policyView,
  Problem,
} from '../../core/wire/admin.js';
import type { Role } from '../auth/tokens.js';
import { Errors } from '../errors.js';
import type { PolicyStore, WriteContext } from '../policies/policy-store.js';
import { policyBodyFor } from '../policies/validate.js';
import {
  etagOf,
  failedPrecondition,
  parseTagCondition,
  type Precondition,
  type TagCondition,
} from '../policies/preconditions.js';
import { principalOf } from './auth-hook.js';

/** A query of a route that takes none: any parameter is refused (400), as the paged routes refuse unknown ones. */
const NoQuery = z.strictObject({});

export interface PolicyRoutesOptions {
  store: PolicyStore;
  /** Configured regions, for the body's region rules. */
  regions: readonly string[];
  auth: (role: Role) => onRequestHookHandler;
}

const IfMatchHeaders = z.looseObject({
  'if-match': z
    .string()
    .optional()
    .describe('apply only if the policy\'s ETag is one of these ("42") or * (exists)'),
});
const PutHeaders = IfMatchHeaders.extend({
  'if-none-match': z.string().optional().describe('* to create only: refused with 412 if the policy exists'),
});
const GetHeaders = z.looseObject({
  'if-none-match': z.string().optional().describe('answer 304 when the ETag still matches'),
});

const problems = {
  400: Problem,
  401: Problem,
  403: Problem,
  404: Problem,
  409: Problem,
  412: Problem,
  413: Problem,
  415: Problem,
  422: Problem,
  503: Problem,
} as const;

const security = [{ bearerAuth: [] }];

function condition(request: FastifyRequest, header: 'if-match' | 'if-none-match'): TagCondition | undefined {
  const value = request.headers[header];
  if (value === undefined) return undefined;
  try {
    return parseTagCondition(Array.isArray(value) ? value.join(',') : value);
  } catch (error) {
    throw new Errors.BAD_PRECONDITION(
      header === 'if-match' ? 'If-Match' : 'If-None-Match',
      (error as Error).message,
    );
  }
}

function writeContext(request: FastifyRequest, precondition: Precondition): WriteContext {
  const { role, name } = principalOf(request);
  return { actor: { role, name }, requestId: request.id, source: request.ip, precondition };
}

export function registerPolicyRoutes(app: AdminApp, { store, regions, auth }: PolicyRoutesOptions): void {
  const PolicyBody = policyBodyFor(regions);
  const read = auth('read');
  const write = auth('write');

  app.get(
    '/v1/policies',
    {
      onRequest: read,
      schema: {
        summary: 'List policies',
        description: 'Every policy, whole: no paging, so no query parameters (one is a 400, never ignored).',
        tags: ['policies'],
        security,
        querystring: NoQuery,
        response: { 200: PolicyList, 401: Problem, 503: Problem },
      },
    },
    async () => ({ policies: (await store.list()).map((s) => policyView(s.policy)) }),
  );

  app.get(
    '/v1/policies/:name',
    {
      onRequest: read,
      schema: {
        summary: 'Read one policy',
        description: 'The stored policy with every default filled; its ETag is the KV revision.',
        tags: ['policies'],
        security,
        params: PolicyParams,
        headers: GetHeaders,
        response: {
          200: PolicyView,
          304: z.undefined(),
          400: Problem,
          401: Problem,
          404: Problem,
          503: Problem,
        },
      },
    },
    async (request, reply) => {
      const ifNoneMatch = condition(request, 'if-none-match');
      const stored = await store.get(request.params.name);
      if (stored === undefined) throw new Errors.POLICY_NOT_FOUND(request.params.name);
      reply.header('etag', etagOf(stored.revision));
      if (ifNoneMatch !== undefined && failedPrecondition({ ifNoneMatch }, stored.revision) !== undefined) {
        return reply.code(304).send();
      }
      return policyView(stored.policy);
    },
  );

  app.put(
    '/v1/policies/:name',
    {
      onRequest: write,
      schema: {
        summary: 'Create or replace a policy',
        description:
          'The body is the policy without its name (the path gives it). Unset fields take their defaults; ' +
          '`maxCost` and `idleTtlSeconds` left unset are derived from capacity and refill and follow later ' +
          'budget changes. A replace that changes the units (kind, window, lease, time zone, shards, subject ' +
          'kind or prefixes) moves the policy to its next version; the version never goes down. ' +
          '201 when created, 200 when replaced or unchanged.',
        tags: ['policies'],
        security,
        params: PolicyParams,
        headers: PutHeaders,
        body: PolicyBody,
        response: { 200: PolicyView, 201: PolicyView, ...problems },
      },
    },
    async (request, reply) => {
      const precondition = {
        ifMatch: condition(request, 'if-match'),
        ifNoneMatch: condition(request, 'if-none-match'),
      };
      const { name } = request.params;
      const result = await store.put(name, request.body, writeContext(request, precondition));
      reply.header('etag', etagOf(result.stored.revision));
      if (result.created) reply.code(201).header('location', `/v1/policies/${name}`);
      return policyView(result.stored.policy);
    },
  );

  app.patch(
    '/v1/policies/:name/budget',
    {
      onRequest: write,
      schema: {
        summary: "Adjust a policy's budget",
        description:
          'Change capacity and/or refillPerSecond. The whole policy is validated again; a maxCost or ' +
          'idleTtlSeconds the operator never set is re-derived, one they set is kept and must still fit ' +
          '(422 otherwise).',
        tags: ['policies'],
        security,
        params: PolicyParams,
        headers: IfMatchHeaders,
        body: BudgetPatch,
        response: { 200: PolicyView, ...problems },
      },
    },
    async (request, reply) => {
      const precondition = { ifMatch: condition(request, 'if-match') };
      const stored = await store.patchBudget(
        request.params.name,
        request.body,
        writeContext(request, precondition),
      );
      reply.header('etag', etagOf(stored.revision));
      return policyView(stored.policy);
    },
  );

  app.delete(
    '/v1/policies/:name',
    {
      onRequest: write,
      schema: {
        summary: 'Delete a policy',
        tags: ['policies'],
        security,
        params: PolicyParams,
        headers: IfMatchHeaders,
        response: { 204: z.undefined(), ...problems },
      },
    },
    async (request, reply) => {
      const precondition = { ifMatch: condition(request, 'if-match') };
      await store.delete(request.params.name, writeContext(request, precondition));
      return reply.code(204).send();
    },
  );
}
