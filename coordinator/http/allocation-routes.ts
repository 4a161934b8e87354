/** `GET /v1/allocations` and `GET /v1/regions`: what the protocol engine holds, read from memory. */
import type { AdminApp } from './admin-app.js';
import type { onRequestHookHandler } from 'fastify';
import {
  AllocationHistory,
  AllocationsResponse,
  HistoryQuery,
  Problem,
  RegionsResponse,
  type RegionSummary,
} from '../../core/wire/admin.js';
import { Errors } from '../errors.js';
import type { Role } from '../auth/tokens.js';
import type { AllocationsReader } from '../ports.js';

export interface AllocationRoutesOptions {
  allocations: AllocationsReader;
  regions: readonly string[];
  auth: (role: Role) => onRequestHookHandler;
}

export function registerAllocationRoutes(
  app: AdminApp,
  { allocations, regions, auth }: AllocationRoutesOptions,
): void {
  const security = [{ bearerAuth: [] }];
  app.get(
    '/v1/allocations',
    {
      onRequest: auth('read'),
      schema: {
        summary: 'Shares, leases and overrides in force',
        tags: ['allocations'],
        security,
        response: { 200: AllocationsResponse, 401: Problem },
      },
    },
    () => ({ policies: allocations.allocations() }),
  );

  app.get(
    '/v1/allocations/history',
    {
      onRequest: auth('read'),
      schema: {
        summary: "Recent samples of one policy's allocation: shares, demand, admitted and refused per region",
        description: 'One sample per rebalance round, the latest 120, oldest first (kept in memory).',
        tags: ['allocations'],
        security,
        querystring: HistoryQuery,
        response: { 200: AllocationHistory, 400: Problem, 401: Problem, 404: Problem },
      },
    },
    (request) => {
      const samples = allocations.history?.(request.query.policy);
      if (samples === undefined) throw new Errors.POLICY_NOT_FOUND(request.query.policy);
      return { policy: request.query.policy, samples };
    },
  );

  app.get(
    '/v1/regions',
    {
      onRequest: auth('read'),
      schema: {
        summary: 'Configured regions: last report, agents, report lag',
        tags: ['allocations'],
        security,
        response: { 200: RegionsResponse, 401: Problem },
      },
    },
    () => {
      const known = new Map(allocations.regions().map((r) => [r.region, r]));
      const out: RegionSummary[] = regions.map(
        (region) => known.get(region) ?? { region, lastReportAt: null, agents: 0, reportLagMs: null },
      );
      return { regions: out };
    },
  );
}
