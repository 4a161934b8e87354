/**
 * The agent's OpenAPI document (`/docs/json`), generated from the zod schemas of core/wire/agent.ts: every route
 * the agent serves is in it, every stable code is named by some route's problem responses, and attaching the
 * schemas changed no answer (they document; the handlers validate).
 */
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../../core/clock.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp, type AgentApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { ModelDecisionStore } from '../../../regional-agent/decisions/model-decision-store.js';
import { AGENT_CODES } from '../../../regional-agent/errors.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';

interface Operation {
  tags?: string[];
  requestBody?: unknown;
  parameters?: { name: string; in: string }[];
  responses: Record<string, { description?: string; content?: Record<string, { schema: unknown }> }>;
}
interface Doc {
  openapi: string;
  info: { description: string };
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, unknown> };
}

let agent: AgentApp;
const served: string[] = [];

beforeAll(async () => {
  agent = buildApp(
    {
      store: new ModelDecisionStore(systemClock),
      policies: new StaticPolicySource([parsePolicy({ name: 'reports', capacity: 5, refillPerSecond: 1 })]),
      shares: new StaticShareView(),
      log: pino({ level: 'silent' }),
    },
    AgentConfig.parse({ region: 'us', redisUrl: 'redis://127.0.0.1:1', policiesFile: 'unused' }),
  );
  agent.app.addHook('onRoute', (route) => {
    for (const m of [route.method].flat()) served.push(`${m} ${route.url}`);
  });
  await agent.ready;
  await agent.app.ready();
});
afterAll(() => agent.close());

/** Every code some `code` enum of the document names. */
function codesIn(value: unknown, found = new Set<string>()): Set<string> {
  if (Array.isArray(value)) for (const v of value) codesIn(v, found);
  else if (typeof value === 'object' && value !== null) {
    const o = value as Record<string, unknown>;
    const code = (o['properties'] as Record<string, { enum?: string[] }> | undefined)?.['code'];
    for (const c of code?.enum ?? []) found.add(c);
    for (const v of Object.values(o)) codesIn(v, found);
  }
  return found;
}

describe('the agent OpenAPI document at /docs', () => {
  it('describes every route the agent serves, from the wire schemas', async () => {
    const res = await agent.app.inject({ url: '/docs/json' });
    expect(res.statusCode).toBe(200);
    const doc = res.json<Doc>();
    expect(doc.openapi).toBe('3.1.0');
    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((m) => `${m.toUpperCase()} ${path.replace(/\{(\w+)\}/g, ':$1')}`),
    );
    const routes = served
      .filter((r) => !r.includes('/docs') && !r.startsWith('HEAD '))
      .map((r) => r.replace('/*', '/{*}'));
    expect(routes.length).toBeGreaterThanOrEqual(12);
    for (const route of routes) {
      const [method, url] = route.split(' ') as [string, string];
      const path = url.replace('/{*}', '/*');
      const inDoc = documented.includes(`${method} ${path}`) || documented.includes(`${method} ${url}`);
      expect(inDoc, route).toBe(true);
    }
    for (const path of [
      '/v1/decisions',
      '/v1/forward-auth',
      '/v1/explain',
      '/healthz',
      '/readyz',
      '/metrics',
    ])
      expect(doc.paths, path).toHaveProperty([path]);
    const decisions = doc.paths['/v1/decisions']!['post']!;
    expect(decisions.tags).toEqual(['decisions']);
    expect(JSON.stringify(decisions.requestBody)).toContain('DecisionRequest');
    expect(Object.keys(decisions.responses).sort()).toEqual([
      '200',
      '400',
      '404',
      '409',
      '413',
      '415',
      '500',
      '503',
    ]);
    expect(doc.paths['/v1/explain']!['get']!.parameters?.map((p) => p.name).sort()).toEqual([
      'cost',
      'policy',
      'subject',
    ]);
    expect(doc.paths['/v1/forward-auth']!['get']!.parameters?.map((p) => p.name).sort()).toEqual([
      'cost',
      'policy',
      'proxy',
    ]);
    expect(Object.keys(doc.paths['/v1/forward-auth/nginx']!['get']!.responses).sort()).toEqual([
      '204',
      '403',
    ]);
    expect(Object.keys(doc.components.schemas)).toEqual(
      expect.arrayContaining(['DecisionRequest', 'DecisionResponse', 'ExplainResponse']),
    );
    const refs = [...res.body.matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g)].map((m) => m[1]!);
    for (const ref of refs) expect(doc.components.schemas, ref).toHaveProperty([ref]);
  });

  it('names every stable code: each on the routes that answer it, AGT_ERR_NOT_FOUND for routes that do not exist', async () => {
    const doc = (await agent.app.inject({ url: '/docs/json' })).json<Doc>();
    const onRoutes = codesIn(doc.paths);
    expect([...AGENT_CODES].filter((c) => !onRoutes.has(c))).toEqual(['AGT_ERR_NOT_FOUND']);
    for (const code of AGENT_CODES) expect(doc.info.description).toContain(code);
    const forwardAuth = codesIn(doc.paths['/v1/forward-auth']);
    expect([...forwardAuth]).toEqual(
      expect.arrayContaining(['RATE_LIMITED', 'LIMITER_UNAVAILABLE', 'AGT_ERR_UNTRUSTED_PROXY']),
    );
    const page = await agent.app.inject({ url: '/docs' });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toContain('text/html');
  });

  it('the schemas document and do not validate: answers are as before', async () => {
    const ok = await agent.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      payload: { policy: 'reports', subject: 'a' },
    });
    expect(ok.statusCode).toBe(200);
    expect(ok.json()).toMatchObject({ allowed: true, results: [{ remaining: 4, limit: 5 }] });
    const bad = await agent.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      payload: { policy: 'reports', extra: 1 },
    });
    expect(bad.statusCode).toBe(400);
    expect(bad.json()).toMatchObject({ code: 'AGT_ERR_INVALID_REQUEST' });
    const query = await agent.app.inject({ url: '/v1/explain?policy=reports' });
    expect(query.json()).toMatchObject({ status: 400, code: 'AGT_ERR_INVALID_QUERY' });
    const metrics = await agent.app.inject({ url: '/metrics' });
    expect(metrics.headers['content-type']).toContain('text/plain');
    expect(metrics.body.startsWith('"')).toBe(false);
    expect(metrics.body).toContain('quotaplane_');
    expect((await agent.app.inject({ url: '/healthz' })).json()).toEqual({ status: 'ok' });
  });
});
