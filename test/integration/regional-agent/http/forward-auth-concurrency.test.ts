/**
 * A concurrency policy hands out slots that its holder gives back (`DELETE /v1/leases/{lease}`, docs/concurrency.md).
 * A proxy asking forward-auth or the gRPC rate-limit service is never told the lease and has no way to give it
 * back: each request it lets through would hold its slot until `leaseSeconds` ran out, so "at most 2 at once"
 * silently became "2 per leaseSeconds" (a third request, long after the first two finished, was a 429). Such a
 * policy is refused on these paths, with a stable code, and takes no slot.
 */
import type { ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { rlsClient, type RlsClient } from '../../../../regional-agent/grpc/rls-client.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [parsePolicy({ name: 'exports', kind: 'concurrency', capacity: 2, leaseSeconds: 300 })];

let fixture: AgentFixture;
let client: RlsClient;
beforeAll(async () => {
  fixture = await agentFixture({ policies, rls: true, config: { trustedProxies: ['127.0.0.1'] } });
  client = rlsClient(fixture.rlsListener.url);
});
afterAll(async () => {
  client?.close();
  await fixture?.[Symbol.asyncDispose]();
});

describe('a concurrency policy through a proxy', () => {
  it('forward-auth refuses it with 400 and takes no slot', async () => {
    const subject = uniquePrefix('x');
    const answers = [];
    for (let i = 0; i < 3; i++) {
      const res = await fixture.app.inject({
        method: 'GET',
        url: '/v1/forward-auth/traefik?policy=exports',
        headers: { 'x-quota-subject': subject },
      });
      answers.push([res.statusCode, (JSON.parse(res.body || '{}') as { code?: string }).code]);
    }
    expect(answers).toEqual(Array(3).fill([400, 'AGT_ERR_INVALID_QUERY']));
    // Nothing was acquired: a client of the policy still gets both slots.
    for (let i = 0; i < 2; i++) {
      const held = await fixture.app.inject({
        method: 'POST',
        url: '/v1/decisions',
        payload: { policy: 'exports', subject },
      });
      expect((JSON.parse(held.body) as { allowed?: boolean }).allowed, held.body).toBe(true);
    }
  });

  it('the gRPC rate-limit service refuses it with INVALID_ARGUMENT', async () => {
    const error = await client
      .shouldRateLimit({
        domain: 'edge',
        descriptors: [
          {
            entries: [
              { key: 'policy', value: 'exports' },
              { key: 'subject', value: uniquePrefix('x') },
            ],
          },
        ],
      })
      .then(
        () => undefined,
        (e: ServiceError) => e,
      );
    expect(error?.code).toBe(3);
  });
});
