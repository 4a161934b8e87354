/**
 * `DELETE /v1/leases/{lease}`: give back the slots a `concurrency` check acquired (core/concurrency.ts). The token
 * names the region, the log and the exact entries; releasing removes those entries and nothing else, so a second
 * release, or one after the lease ran out, answers `released: false` and changes nothing.
 */
import type { FastifyInstance } from 'fastify';
import { LeaseParams, LeaseReleaseResponse } from '../../core/wire/agent.js';
import { leaseRelease, parseLeaseToken, type LeaseKey } from '../../core/concurrency.js';
import { kindOf } from '../../core/kinds/index.js';
import type { PolicySource } from '../policies/policy-source.js';
import type { DecisionStore } from '../decisions/decision-store.js';
import { AgentErrors } from '../errors.js';
import type { AgentMetrics } from '../observability/metrics.js';
import type { StoreGuard } from '../resilience/store-guard.js';
import { COMMON_PROBLEMS, problems } from './docs.js';
import { ignoreContentTypeOfBodylessDelete } from '../../common/http/bodyless-delete.js';

const schema = {
  summary: 'Release the slots of a concurrency lease (idempotent)',
  description:
    'The lease is the token a `concurrency` check result carried. 200 either way: `released` says whether this ' +
    'call gave the slots back or they were already released or expired.',
  tags: ['leases'],
  params: LeaseParams,
  response: {
    200: LeaseReleaseResponse,
    ...problems({
      ...COMMON_PROBLEMS,
      400: ['AGT_ERR_INVALID_LEASE'],
      414: ['AGT_ERR_URI_TOO_LONG'],
      404: ['AGT_ERR_UNKNOWN_POLICY'],
      421: ['AGT_ERR_WRONG_REGION'],
      503: [...COMMON_PROBLEMS[503], 'AGT_ERR_STORE_UNAVAILABLE'],
    }),
  },
};

export interface LeasesRouteOptions {
  store: DecisionStore;
  guard: StoreGuard;
  policies: PolicySource;
  metrics: AgentMetrics;
  region: string;
  /** The key lease tokens are signed with (core/concurrency.ts). */
  leaseKey: LeaseKey;
  assertServing: () => void;
}

export function leasesRoute(app: FastifyInstance, options: LeasesRouteOptions): void {
  const { store, guard, policies, metrics, region, leaseKey, assertServing } = options;
  app.delete<{ Params: { lease: string } }>(
    '/v1/leases/:lease',
    { schema, onRequest: ignoreContentTypeOfBodylessDelete },
    async (request): Promise<LeaseReleaseResponse> => {
      assertServing();
      const parsed = parseLeaseToken(request.params.lease, leaseKey);
      if (!parsed.ok) {
        // Another region's token is signed with that region's key: misdirected, not forged, as far as we know.
        if (parsed.region !== undefined && parsed.region !== region) {
          throw new AgentErrors.AGT_ERR_WRONG_REGION('lease', parsed.region);
        }
        throw new AgentErrors.AGT_ERR_INVALID_LEASE(parsed.reason);
      }
      const { lease } = parsed;
      if (lease.region !== region) throw new AgentErrors.AGT_ERR_WRONG_REGION('lease', lease.region);
      const policy = policies.current().get(lease.policy);
      if (policy === undefined) throw new AgentErrors.AGT_ERR_UNKNOWN_POLICY(lease.policy);
      if (!kindOf(policy.kind).leases) {
        throw new AgentErrors.AGT_ERR_INVALID_LEASE(`${lease.policy} is not a concurrency policy`);
      }
      let removed: number;
      try {
        removed = (await guard.run('refund', () => store.refundLog(leaseRelease(lease)))).removed[0] ?? 0;
      } catch (error) {
        metrics.leaseReleases.labels(policy.name, 'failed').inc();
        throw new AgentErrors.AGT_ERR_STORE_UNAVAILABLE(error instanceof Error ? error.name : 'no answer');
      }
      metrics.leaseReleases.labels(policy.name, removed > 0 ? 'released' : 'gone').inc();
      return { policy: policy.name, released: removed > 0, slots: removed };
    },
  );
}
