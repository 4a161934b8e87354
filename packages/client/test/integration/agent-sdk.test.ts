import { readFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { parsePoliciesFile } from '../../../../regional-agent/policies/file-policy-source.js';
import { AgentClient, AgentRequestError } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import { buildReportsApp } from '../../../../examples/reports-service/app.js';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../../../test/helpers/agent-fixture.js';

const policiesPath = new URL('../../../../examples/reports-service/policies.json', import.meta.url);
const policies = parsePoliciesFile('policies.json', readFileSync(policiesPath, 'utf8'));

let agent: AgentFixture;
let connections = 0;
let client: AgentClient;
let service: FastifyInstance;

beforeAll(async () => {
  agent = await agentFixture({
    policies: [...policies.values()],
    config: { decisionDeadlineMs: 500, storeTimeoutMs: 500 },
    listen: true,
  });
  agent.app.server.on('connection', () => connections++);
  client = new AgentClient({ baseUrl: agent.url, timeoutMs: 1000 });
  service = await buildReportsApp({ client });
});
afterAll(async () => {
  await service.close();
  client.close();
  await agent[Symbol.asyncDispose]();
});

const exportReport = (tenant: string, pages = 1) =>
  service.inject({
    method: 'POST',
    url: '/reports',
    headers: { 'x-tenant-id': tenant },
    payload: { pages },
  });

describe('the example service protected by the plugin, against a real agent and Redis', () => {
  it('admits within quota and forwards the RateLimit headers', async () => {
    const tenant = uniquePrefix('acme');
    const res = await exportReport(tenant, 3);
    expect(res.statusCode).toBe(201);
    expect(res.headers['ratelimit-policy']).toBe('"reports";q=5;w=50, "export-pages";q=100;w=100');
    expect(res.headers['ratelimit']).toBe('"reports";r=4;t=10, "export-pages";r=97;t=3');
    // Unprotected routes are untouched.
    const read = await service.inject({ method: 'GET', url: '/reports/1' });
    expect(read.statusCode).toBe(200);
    expect(read.headers['ratelimit']).toBeUndefined();
  });

  it('answers 429 problem+json with Retry-After once over quota, and the handler does not run', async () => {
    const tenant = uniquePrefix('busy');
    const codes: number[] = [];
    for (let i = 0; i < 6; i++) codes.push((await exportReport(tenant)).statusCode);
    expect(codes).toEqual([201, 201, 201, 201, 201, 429]);
    const over = await exportReport(tenant);
    expect(over.statusCode).toBe(429);
    expect(over.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(Number(over.headers['retry-after'])).toBe(10);
    expect(over.json()).toMatchObject({ code: 'RATE_LIMITED', 'violated-policies': ['reports'] });
  });

  it('answers 400 without a subject', async () => {
    const res = await service.inject({ method: 'POST', url: '/reports', payload: {} });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: 'AGT_ERR_MISSING_SUBJECT' });
  });

  it('the client keeps connections alive: many decisions, few sockets', async () => {
    const before = connections;
    const tenant = uniquePrefix('keep');
    for (let i = 0; i < 20; i++) await client.check('export-pages', `tenant:${tenant}`);
    expect(connections - before).toBeLessThanOrEqual(1);
  });

  it('the client throws AgentRequestError for what the agent refuses', async () => {
    await expect(client.check('nope', 'tenant:x')).rejects.toBeInstanceOf(AgentRequestError);
    await expect(client.check('nope', 'tenant:x')).rejects.toMatchObject({
      status: 404,
      code: 'AGT_ERR_UNKNOWN_POLICY',
    });
  });
});

describe('the client when the agent cannot answer', () => {
  let silent: Server;
  const sockets: Socket[] = [];
  let silentUrl: string;
  beforeAll(async () => {
    // Accepts connections and never answers: a frozen agent.
    silent = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    silentUrl = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => silent.close(r));
  });

  it('fails closed by default within its timeout, and the plugin answers 503', async () => {
    const failures: Error[] = [];
    const closed = new AgentClient({ baseUrl: silentUrl, timeoutMs: 60, onFailure: (e) => failures.push(e) });
    const started = performance.now();
    const d = await closed.check('reports', 'tenant:a');
    const ms = performance.now() - started;
    expect(ms).toBeGreaterThanOrEqual(50);
    expect(ms).toBeLessThan(1000);
    expect(d).toMatchObject({
      allowed: false,
      retryAfterMs: 1000,
      results: [{ reason: 'agent_unreachable' }],
    });
    expect(failures).toHaveLength(1);
    const app = await buildReportsApp({ client: closed });
    const res = await app.inject({
      method: 'POST',
      url: '/reports',
      headers: { 'x-tenant-id': 'a' },
      payload: {},
    });
    expect(res.statusCode).toBe(503);
    expect(res.json()).toMatchObject({
      code: 'LIMITER_UNAVAILABLE',
      type: 'https://iana.org/assignments/http-problem-types#temporary-reduced-capacity',
    });
    expect(res.headers['retry-after']).toBe('1');
    await app.close();
    closed.close();
  });

  it('fails open when configured, on a refused connection as on a timeout', async () => {
    const open = new AgentClient({ baseUrl: 'http://127.0.0.1:9', timeoutMs: 200, onUnavailable: 'open' });
    expect(await open.check('reports', 'tenant:a')).toMatchObject({
      allowed: true,
      results: [{ allowed: true, reason: 'agent_unreachable' }],
    });
    open.close();
  });
});

describe('the plugin never shows the agent internals to end users', () => {
  interface Line {
    level: number;
    msg: string;
    code?: string;
  }
  async function serviceWith(client: AgentClient, refused: AgentRequestError[], lines: Line[]) {
    const app = Fastify({
      loggerInstance: pino(
        { level: 'info' },
        { write: (line: string) => void lines.push(JSON.parse(line) as Line) },
      ),
    });
    await app.register(quotaplane, {
      client,
      subject: (request) =>
        typeof request.headers['x-tenant-id'] === 'string'
          ? `tenant:${request.headers['x-tenant-id']}`
          : undefined,
      onRefused: (error) => refused.push(error),
    });
    app.get('/gone', { config: { quota: { policy: 'deleted-policy' } } }, () => ({ ran: true }));
    app.get('/gone-open', { config: { quota: { policy: 'deleted-policy', onUnavailable: 'open' } } }, () => ({
      ran: true,
    }));
    app.get(
      '/gone-local',
      { config: { quota: { policy: 'deleted-policy', onUnavailable: 'local' } } },
      () => ({
        ran: true,
      }),
    );
    app.get('/reports', { config: { quota: { policy: 'reports' } } }, () => ({ ran: true }));
    return app;
  }

  it('an unknown policy is a loud log, a count, a callback and a 500 naming it, whatever the failure mode', async () => {
    const own = new AgentClient({
      baseUrl: agent.url,
      timeoutMs: 2000,
      fallback: { capacity: 2, refillPerSecond: 0.001 },
    });
    const refused: AgentRequestError[] = [];
    const lines: Line[] = [];
    const app = await serviceWith(own, refused, lines);
    const headers = { 'x-tenant-id': uniquePrefix('gone') };
    // The operator's view: the agent counts every check of an unknown policy (QuotaplaneUnknownPolicy).
    const unknownOnAgent = async () => {
      const text = (await agent.app.inject({ url: '/metrics' })).body;
      return Number(
        /^quotaplane_request_errors_total\{code="AGT_ERR_UNKNOWN_POLICY"\} (\d+)/m.exec(text)?.[1] ?? 0,
      );
    };
    const unknownBefore = await unknownOnAgent();
    const answers = await Promise.all(
      ['/gone', '/gone-open', '/gone-local', '/gone-local', '/gone-local'].map((url) =>
        app.inject({ url, headers }),
      ),
    );
    for (const res of answers) {
      // A configuration error, not an outage: no 503, no Retry-After, the handler never ran.
      expect(res.statusCode).toBe(500);
      expect(res.headers['retry-after']).toBeUndefined();
      expect(res.json()).toEqual({
        type: 'about:blank',
        title: 'Internal Server Error',
        status: 500,
        code: 'QUOTA_MISCONFIGURED',
        detail:
          "the rate limiter does not know policy deleted-policy (deleted, or never created): the service's " +
          'rate-limit configuration must be fixed; retrying will not help',
        'agent-code': 'AGT_ERR_UNKNOWN_POLICY',
      });
    }
    expect(refused.map((e) => e.code)).toEqual(Array(5).fill('AGT_ERR_UNKNOWN_POLICY'));
    expect(own.stats().refused).toEqual({ AGT_ERR_UNKNOWN_POLICY: 5 });
    expect(own.stats().failures.refused).toBe(0);
    expect(own.stats().degraded).toEqual({ fail_closed: 0, fail_open: 0, fallback: 0 });
    const loud = lines.filter((l) => l.level === 50);
    expect(loud).toHaveLength(5);
    expect(loud[0]).toMatchObject({ code: 'AGT_ERR_UNKNOWN_POLICY' });
    expect(loud[0]!.msg).toContain('the agent refused this route');
    expect((await unknownOnAgent()) - unknownBefore).toBe(5);
    // A known policy is still decided by the agent.
    expect((await app.inject({ url: '/reports', headers })).statusCode).toBe(200);
    await app.close();
    own.close();
  });

  it("a cost above maxCost is the caller's 400 when the request sets it, the configuration's 500 when fixed", async () => {
    const tenant = uniquePrefix('pages');
    const tooMany = await exportReport(tenant, 60);
    expect(tooMany.statusCode).toBe(400);
    expect(tooMany.headers['retry-after']).toBeUndefined();
    expect(tooMany.json()).toEqual({
      type: 'about:blank',
      title: 'Bad Request',
      status: 400,
      code: 'AGT_ERR_COST_ABOVE_MAX',
      detail: 'this request costs more than one request may cost',
    });
    const refused: AgentRequestError[] = [];
    const app = await serviceWith(client, refused, []);
    app.get('/fixed', { config: { quota: { policy: 'export-pages', cost: 60 } } }, () => ({ ran: true }));
    const fixed = await app.inject({ url: '/fixed', headers: { 'x-tenant-id': tenant } });
    expect(fixed.statusCode).toBe(500);
    expect(fixed.json()).toMatchObject({
      code: 'QUOTA_MISCONFIGURED',
      'agent-code': 'AGT_ERR_COST_ABOVE_MAX',
    });
    expect(refused.map((e) => e.code)).toEqual(['AGT_ERR_COST_ABOVE_MAX']);
    await app.close();
  });

  it('a 429 names the violated policy alone and why', async () => {
    const tenant = uniquePrefix('why');
    for (let i = 0; i < 5; i++) expect((await exportReport(tenant)).statusCode).toBe(201);
    const over = await exportReport(tenant);
    expect(over.statusCode).toBe(429);
    expect(over.json()).toMatchObject({
      code: 'RATE_LIMITED',
      'violated-policies': ['reports'],
      reason: 'subject_exhausted',
    });
  });

  it("a subject the agent finds invalid is the caller's 400, without the agent's message", async () => {
    const refused: AgentRequestError[] = [];
    const app = await serviceWith(client, refused, []);
    // Characters the agent does not key, more than a key holds (96), more than the wire carries (1,024): one at a
    // time (a single decision), then all in one turn (one batch, each element refused on its own).
    const tenants = ['has spaces {and braces}', 'x'.repeat(97), 'x'.repeat(1025), 'x'.repeat(5000)];
    const one = (tenant: string) => app.inject({ url: '/reports', headers: { 'x-tenant-id': tenant } });
    const alone = [];
    for (const tenant of tenants) alone.push(await one(tenant));
    const batchesBefore = client.stats().batches;
    const together = await Promise.all(tenants.map(one));
    expect(client.stats().batches).toBeGreaterThan(batchesBefore);
    for (const res of [...alone, ...together]) {
      expect(res.statusCode).toBe(400);
      expect(res.json()).toEqual({
        type: 'about:blank',
        title: 'Bad Request',
        status: 400,
        code: 'AGT_ERR_INVALID_SUBJECT',
        detail: 'the subject of this request is not valid',
      });
    }
    expect(refused).toEqual([]);
    await app.close();
  });
});
