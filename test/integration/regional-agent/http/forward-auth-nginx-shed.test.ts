/**
 * An agent that decides nothing (its admission control sheds the request: 503 AGT_ERR_OVERLOADED) behind the nginx
 * block docs/proxies.md shows: nothing was decided, as when the agent cannot be reached, so each route's own failure
 * mode must apply (docs/agent.md, Overload: "a proxy can act on the 503 … apply the route's failure mode"): the
 * fail-open `/api/search` lets the request through, the fail-closed `/api/reports` answers 503.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicy } from '../../../../core/policy/policy.js';
import { uniquePrefix } from '../../../harness/fixtures.js';
import { startNginx, type NginxServer } from '../../../harness/nginx.js';
import { docBlock, substitute } from '../../../helpers/doc-blocks.js';
import { agentFixture, type AgentFixture } from '../../../helpers/agent-fixture.js';

const documented = docBlock('proxies.md', 'forward-auth-nginx');
const SECRET = /X-Quota-Secret\s+"([^"]+)"/.exec(documented)![1]!;

const policies = [
  parsePolicy({ name: 'reports', capacity: 3, refillPerSecond: 0.001, idleTtlSeconds: 3600 }),
  parsePolicy({
    name: 'search',
    capacity: 10,
    refillPerSecond: 0.001,
    idleTtlSeconds: 20_000,
    maxCost: 2,
    onStoreFailure: 'open',
  }),
];

let fixture: AgentFixture;
let service: Server;
let nginx: NginxServer;
const name = `shed${uniquePrefix('n').replace(/[^a-z0-9]/g, '')}`;

beforeAll(async () => {
  fixture = await agentFixture({
    policies,
    listen: true,
    config: { maxInFlight: 1, trustedProxies: ['127.0.0.1'], forwardAuthSecret: SECRET },
  });
  service = createServer((req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ path: req.url }));
  });
  await new Promise<void>((resolve) => service.listen(0, '127.0.0.1', resolve));
  const servicePort = (service.address() as AddressInfo).port;
  nginx = await startNginx(({ port, dir }) => {
    const passwords = join(dir, 'users.htpasswd');
    writeFileSync(passwords, `${name}:{PLAIN}pw\n`);
    return substitute(documented, {
      'server 127.0.0.1:7101;': `server ${new URL(fixture.url).host};`,
      'server 127.0.0.1:8080;': `server 127.0.0.1:${servicePort};`,
      'listen 127.0.0.1:8000;': `listen 127.0.0.1:${port};`,
      '/etc/nginx/quotaplane.htpasswd': passwords,
    });
  });
});

afterAll(async () => {
  await nginx?.[Symbol.asyncDispose]();
  await new Promise((resolve) => service?.close(resolve));
  await fixture?.[Symbol.asyncDispose]();
});

async function get(path: string) {
  const res = await fetch(`${nginx.url}${path}`, {
    headers: { authorization: `Basic ${Buffer.from(`${name}:pw`).toString('base64')}` },
  });
  return { status: res.status, text: await res.text() };
}

describe('nginx in front of an agent that sheds every request', () => {
  it('applies each route failure mode: search passes, reports answers 503', async () => {
    // The one in-flight slot is taken: every forward-auth request is shed with 503 AGT_ERR_OVERLOADED.
    const leave = fixture.agent.admission.enter('http');
    expect(typeof leave).toBe('function');
    try {
      const direct = await fetch(`${fixture.url}/v1/forward-auth/nginx?policy=search`, {
        headers: { 'x-quota-subject': `user:${name}`, 'x-quota-secret': SECRET },
      });
      expect(direct.headers.get('x-quota-code') ?? ((await direct.json()) as { code?: string }).code).toBe(
        'AGT_ERR_OVERLOADED',
      );
      const open = await get('/api/search?q=1');
      expect([open.status, open.text]).toEqual([200, JSON.stringify({ path: '/api/search?q=1' })]);
      const closed = await get('/api/reports/1');
      expect(closed.status).toBe(503);
    } finally {
      if (typeof leave === 'function') leave();
    }
  });
});
