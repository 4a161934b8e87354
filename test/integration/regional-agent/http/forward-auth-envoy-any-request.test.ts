/**
 * Envoy ext_authz (HTTP service) sends the original method and appends the original path (query included) to
 * `path_prefix`; docs/proxies.md: "any method on /v1/forward-auth/envoy/<original path>", the policy and cost in
 * headers. Every status below 500 but 200 is a denial Envoy sends to the client, so the agent must decide any
 * request Envoy can send there: a WebDAV method, the QUERY method (no content-type: ext_authz does not pass it
 * on), a body without a content type (`with_request_body`), a path that is not valid percent-encoding. Each was
 * a 404, 400 or 415 the client received in place of its answer, charged nothing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const policies = [
  parsePolicy({ name: 'reports', capacity: 100, refillPerSecond: 0.001, idleTtlSeconds: 200_000 }),
];
let fixture: AgentFixture;
beforeAll(async () => {
  fixture = await agentFixture({ policies, config: { trustedProxies: ['127.0.0.1'] } });
});
afterAll(async () => {
  await fixture?.[Symbol.asyncDispose]();
});

describe('/v1/forward-auth/envoy decides whatever request Envoy forwards', () => {
  it('any method, any original path, a body without a content type', async () => {
    const subject = uniquePrefix('e');
    const headers = { 'x-quota-subject': subject, 'x-quota-policy': 'reports' };
    const requests: [string, string, Record<string, string>, string?][] = [
      ['PROPFIND', '/v1/forward-auth/envoy/dav/reports/', {}],
      ['MKCOL', '/v1/forward-auth/envoy/dav/reports/new', {}],
      ['QUERY', '/v1/forward-auth/envoy/api/reports', {}],
      ['GET', '/v1/forward-auth/envoy/api/reports/100%', {}],
      ['GET', '/v1/forward-auth/envoy/api/reports?q=%zz', {}],
      ['POST', '/v1/forward-auth/envoy/api/reports', { 'content-length': '7' }, 'a=1&b=2'],
    ];
    const answers = [];
    for (const [method, url, extra, payload] of requests) {
      const res = await fixture.app.inject({
        method: method as 'GET',
        url,
        headers: { ...headers, ...extra },
        ...(payload === undefined ? {} : { payload }),
      });
      answers.push([method, url, res.statusCode, res.headers['ratelimit']]);
    }
    expect(answers).toEqual(
      requests.map(([method, url], i) => [method, url, 200, `"reports";r=${99 - i};t=${(i + 1) * 1000}`]),
    );
  });
});
