/**
 * A descriptor no rule matches is not limited (docs/proxies.md, as Envoy's own rate-limit service): whatever its
 * value, it must not turn the whole call into a gRPC error. Envoy builds descriptor values from request headers
 * and the path (`request_headers`, `:path` with its query), so a value may be long, or empty (a header sent
 * empty); a call refused with INVALID_ARGUMENT for it would drop every other descriptor's limit under Envoy's
 * default `failure_mode_deny: false`, or answer 503 under `true`.
 */
import type { ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { rlsClient, type RlsCall, type RlsClient } from '../../../../regional-agent/grpc/rls-client.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'reports', capacity: 10, refillPerSecond: 0.001, idleTtlSeconds: 10_000 }),
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

const tenant = (subject: string): RlsCall['descriptors'][number] => ({
  entries: [
    { key: 'policy', value: 'reports' },
    { key: 'subject', value: subject },
  ],
});
const outcome = (call: Promise<unknown>) =>
  call.then(
    (r) => r,
    (e: ServiceError) => ({ grpcError: e.code, details: e.details }),
  );

describe('an unmatched descriptor, whatever its value', () => {
  it('leaves the matched ones decided: a long path, an empty header', async () => {
    const s = uniquePrefix('t');
    const unmatched: RlsCall['descriptors'] = [
      { entries: [{ key: 'path', value: `/api/reports?q=${'x'.repeat(300)}` }] },
      { entries: [{ key: 'user_agent', value: '' }] },
    ];
    let left = 10;
    for (const other of unmatched) {
      const r = await outcome(client.shouldRateLimit({ domain: 'edge', descriptors: [tenant(s), other] }));
      left -= 1;
      expect(r).toMatchObject({ overall_code: 'OK' });
      const statuses = (r as { statuses: { code: string; limit_remaining: number }[] }).statuses;
      expect(statuses.map((x) => [x.code, x.limit_remaining])).toEqual([
        ['OK', left],
        ['OK', 0],
      ]);
    }
  });

  it('a matched descriptor with an empty subject is still INVALID_ARGUMENT', async () => {
    const r = await outcome(client.shouldRateLimit({ domain: 'edge', descriptors: [tenant('')] }));
    expect(r).toMatchObject({ grpcError: 3 });
  });
});
