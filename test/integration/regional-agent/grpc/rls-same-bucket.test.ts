/**
 * Two descriptors of one request that name the same bucket are one check charged once each (docs/proxies.md),
 * whatever the policy's maxCost (1 by default: each descriptor's hits_addend is held to it, not their sum), and
 * whatever the spelling: two descriptors that name the same bucket in different spellings (an `ip` policy counts the
 * canonical prefix of an address: two addresses of one /64, or one address in upper and lower case) are one
 * bucket charged once each, as docs/proxies.md says of descriptors naming the same bucket: never a gRPC
 * INTERNAL error (which Envoy's failure_mode_deny turns into a pass or a 503).
 */
import type { ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { rlsClient, type RlsCall, type RlsClient } from '../../../../regional-agent/grpc/rls-client.js';
import { uniqueIpv6Group, uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [
  // maxCost is 1 by default.
  parsePolicy({ name: 'reports', capacity: 10, refillPerSecond: 0.001, idleTtlSeconds: 10_000 }),
  parsePolicy({
    name: 'anon',
    capacity: 10,
    refillPerSecond: 0.001,
    idleTtlSeconds: 10_000,
    subjectKind: 'ip',
  }),
];

let fixture: AgentFixture;
let client: RlsClient;
beforeAll(async () => {
  fixture = await agentFixture({ policies, rls: true });
  client = rlsClient(fixture.rlsListener.url);
});
afterAll(async () => {
  client?.close();
  await fixture?.[Symbol.asyncDispose]();
});

const generic = (policy: string, subject: string): RlsCall['descriptors'][number] => ({
  entries: [
    { key: 'policy', value: policy },
    { key: 'subject', value: subject },
  ],
});
const outcome = (call: Promise<unknown>) =>
  call.then(
    (r) => r,
    (e: ServiceError) => ({ grpcError: e.code, details: e.details }),
  );

describe('descriptors naming one bucket', () => {
  it('on a policy of the default maxCost (1): charged once each, not INVALID_ARGUMENT', async () => {
    const s = uniquePrefix('t');
    const r = await outcome(
      client.shouldRateLimit({ domain: 'edge', descriptors: [generic('reports', s), generic('reports', s)] }),
    );
    expect(r).toMatchObject({ overall_code: 'OK' });
    const statuses = (r as { statuses: { code: string; limit_remaining: number }[] }).statuses;
    expect(statuses.map((x) => [x.code, x.limit_remaining])).toEqual([
      ['OK', 8],
      ['OK', 8],
    ]);
    // Each descriptor's own hits are still held to maxCost.
    const over = await outcome(
      client.shouldRateLimit({ domain: 'edge', descriptors: [generic('reports', s)], hits_addend: 2 }),
    );
    expect(over).toMatchObject({ grpcError: 3 });
  });

  it('are one bucket charged once each, not INTERNAL', async () => {
    const group = `2001:db8:${uniqueIpv6Group()}:1`;
    const cases: [string, string][] = [
      [`${group}::1`, `${group}::2`],
      [`${group}::a`.toUpperCase(), `${group}::a`.toLowerCase()],
    ];
    let charged = 0;
    for (const [a, b] of cases) {
      const r = await outcome(
        client.shouldRateLimit({ domain: 'edge', descriptors: [generic('anon', a), generic('anon', b)] }),
      );
      charged += 2;
      expect(r).toMatchObject({ overall_code: 'OK' });
      const statuses = (r as { statuses: { code: string; limit_remaining: number }[] }).statuses;
      expect(statuses.map((s) => [s.code, s.limit_remaining])).toEqual([
        ['OK', 10 - charged],
        ['OK', 10 - charged],
      ]);
    }
    expect(await fixture.metric(/quotaplane_rls_requests_total\{outcome="internal"\} (\d+)/)).toBe(0);
  });
});
