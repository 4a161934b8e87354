/**
 * The rest of the admin API on a real NATS: auth, audit trail, allocations and regions through the engine port,
 * OpenAPI, probes and metrics.
 */
import { describe, expect, it } from 'vitest';
import type { AllocationSummary, AuditResponse, RegionSummary } from '../../../../core/wire/admin.js';
import { ManualClock } from '../../../../core/clock.js';
import type { AllocationsReader } from '../../../../coordinator/ports.js';
import {
  ADMIN_TOKEN,
  READ_TOKEN,
  admin,
  coordinatorFixture,
  reader,
  type CoordinatorFixture,
} from '../../../helpers/coordinator-fixture.js';

const json = { 'content-type': 'application/json' };

function put(f: CoordinatorFixture, name: string, body: unknown, headers: Record<string, string> = admin) {
  return f.app.inject({
    method: 'PUT',
    url: `/v1/policies/${name}`,
    headers: { ...headers, ...json },
    payload: JSON.stringify(body),
  });
}

async function audit(f: CoordinatorFixture, query = ''): Promise<AuditResponse> {
  const r = await f.app.inject({ url: `/v1/audit${query}`, headers: reader });
  expect(r.statusCode).toBe(200);
  return r.json<AuditResponse>();
}

async function metric(f: CoordinatorFixture, line: string): Promise<number | undefined> {
  const text = (await f.app.inject({ url: '/metrics' })).body;
  const found = text.split('\n').find((l) => l.startsWith(`${line} `));
  return found === undefined ? undefined : Number(found.slice(line.length + 1));
}

describe('coordinator auth', () => {
  it('answers 401 with WWW-Authenticate without a token or with a wrong one, 403 for a read token that writes', async () => {
    await using f = await coordinatorFixture();
    const none = await f.app.inject({ url: '/v1/policies' });
    expect(none.statusCode).toBe(401);
    expect(none.headers['www-authenticate']).toBe('Bearer realm="quotaplane-coordinator"');
    expect(none.json()).toMatchObject({ code: 'COORD_ERR_UNAUTHORIZED', status: 401 });

    for (const authorization of [
      'Bearer not-the-token-000000000',
      `Bearer ${ADMIN_TOKEN}x`,
      `Bearer ${ADMIN_TOKEN.slice(0, -1)}`,
      `Basic ${Buffer.from(`admin:${ADMIN_TOKEN}`).toString('base64')}`,
      ADMIN_TOKEN,
    ]) {
      const r = await f.app.inject({ url: '/v1/policies', headers: { authorization } });
      expect(r.statusCode, authorization).toBe(401);
    }
    const wrong = await f.app.inject({
      url: '/v1/policies',
      headers: { authorization: 'Bearer wrong-token-0000000' },
    });
    expect(wrong.headers['www-authenticate']).toBe(
      'Bearer realm="quotaplane-coordinator", error="invalid_token"',
    );
    // The scheme is case-insensitive (RFC 6750 §2.1 via RFC 9110).
    expect(
      (await f.app.inject({ url: '/v1/policies', headers: { authorization: `bearer ${READ_TOKEN}` } }))
        .statusCode,
    ).toBe(200);

    const forbidden = await put(f, 'p', { capacity: 1, refillPerSecond: 1 }, reader);
    expect(forbidden.statusCode).toBe(403);
    expect(forbidden.headers['www-authenticate']).toContain('error="insufficient_scope"');
    expect(forbidden.json()).toMatchObject({
      code: 'COORD_ERR_FORBIDDEN',
      detail: 'The read role may not change policies',
    });

    expect(await metric(f, 'qp_coord_auth_failures_total{reason="missing"}')).toBe(1);
    expect(await metric(f, 'qp_coord_auth_failures_total{reason="invalid"}')).toBe(6);
    expect(await metric(f, 'qp_coord_auth_failures_total{reason="forbidden"}')).toBe(1);
  });

  it('checks the token before reading the body', async () => {
    await using f = await coordinatorFixture({ bodyLimitBytes: 300 });
    const r = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/p',
      headers: json,
      payload: JSON.stringify({ pad: 'x'.repeat(1000) }),
    });
    expect(r.statusCode).toBe(401);
  });

  it('never writes a token to the log, the audit trail or a response', async () => {
    const lines: string[] = [];
    const { pino } = await import('pino');
    const logger = pino({ level: 'trace' }, { write: (s: string) => lines.push(s) });
    await using f = await coordinatorFixture({ logger });
    await put(f, 'p', { capacity: 1, refillPerSecond: 1 });
    await f.app.inject({ url: '/v1/policies', headers: { authorization: 'Bearer wrong-token-0000000' } });
    await f.app.inject({ url: '/v1/policies/p', headers: reader });
    const trail = JSON.stringify(await audit(f));
    expect(lines.length).toBeGreaterThan(0);
    for (const text of [...lines, trail]) {
      expect(text).not.toContain(ADMIN_TOKEN);
      expect(text).not.toContain(READ_TOKEN);
      expect(text).not.toContain('wrong-token-0000000');
    }
  });
});

describe('coordinator audit trail', () => {
  it('records who, what, before, after and when for every change, newest first', async () => {
    const clock = new ManualClock(Date.UTC(2030, 0, 1));
    await using f = await coordinatorFixture({ clock });
    await put(f, 'p', { capacity: 10, refillPerSecond: 1 });
    clock.advance(1000);
    await f.app.inject({
      method: 'PATCH',
      url: '/v1/policies/p/budget',
      headers: { ...admin, ...json, 'x-request-id': 'change-42' },
      payload: JSON.stringify({ refillPerSecond: 2 }),
    });
    clock.advance(1000);
    await f.app.inject({ method: 'DELETE', url: '/v1/policies/p', headers: admin });
    // Refused and no-op requests leave no record.
    await put(f, 'q', { capacity: -1, refillPerSecond: 1 });
    await put(f, 'q', { capacity: 1, refillPerSecond: 1 }, reader);

    const { entries, next } = await audit(f);
    expect(next).toBeNull();
    expect(entries.map((e) => [e.seq, e.action, e.policy, e.revision, e.at])).toEqual([
      [3, 'delete', 'p', 3, '2030-01-01T00:00:02.000Z'],
      [2, 'budget', 'p', 2, '2030-01-01T00:00:01.000Z'],
      [1, 'create', 'p', 1, '2030-01-01T00:00:00.000Z'],
    ]);
    const budget = entries[1]!;
    expect(budget.actor).toEqual({ role: 'write', name: 'admin' });
    expect(budget.requestId).toBe('change-42');
    expect(budget.before).toMatchObject({ name: 'p', refillPerSecond: 1, idleTtlSeconds: 60 });
    expect(budget.after).toMatchObject({ name: 'p', refillPerSecond: 2, idleTtlSeconds: 60 });
    expect(entries[0]!.after).toBeNull();
    expect(entries[2]!.before).toBeNull();
  });

  it('filters by policy and pages back with before', async () => {
    await using f = await coordinatorFixture();
    for (let i = 1; i <= 5; i++) {
      await put(f, 'a', { capacity: i, refillPerSecond: 1 });
      await put(f, 'b', { capacity: i, refillPerSecond: 1 });
    }
    const first = await audit(f, '?policy=a&limit=2');
    expect(first.entries.map((e) => [e.policy, e.after?.capacity])).toEqual([
      ['a', 5],
      ['a', 4],
    ]);
    expect(first.next).toBe(first.entries[1]!.seq);
    const second = await audit(f, `?policy=a&limit=2&before=${first.next}`);
    expect(second.entries.map((e) => e.after?.capacity)).toEqual([3, 2]);
    const third = await audit(f, `?policy=a&limit=2&before=${second.next}`);
    expect(third.entries.map((e) => e.after?.capacity)).toEqual([1]);
    expect(third.next).toBeNull();

    const all = await audit(f, '?limit=3');
    expect(all.entries.map((e) => e.seq)).toEqual([10, 9, 8]);
    expect(all.next).toBe(8);
    const rest = await audit(f, '?limit=100&before=8');
    expect(rest.entries.map((e) => e.seq)).toEqual([7, 6, 5, 4, 3, 2, 1]);
    expect(rest.next).toBeNull();
  });

  it('refuses bad queries with 400', async () => {
    await using f = await coordinatorFixture();
    for (const q of [
      '?limit=0',
      '?limit=1001',
      '?limit=abc',
      '?policy=Bad..Name',
      '?before=-1',
      '?colour=red',
    ]) {
      const r = await f.app.inject({ url: `/v1/audit${q}`, headers: reader });
      expect(r.statusCode, q).toBe(400);
      expect(r.json(), q).toMatchObject({ code: 'COORD_ERR_VALIDATION' });
    }
  });

  it('stays bounded: the oldest records go first', async () => {
    await using f = await coordinatorFixture();
    const { ensureAuditStream } = await import('../../../../coordinator/audit/jetstream-audit-trail.js');
    const { jetstreamManager } = await import('@nats-io/jetstream');
    await ensureAuditStream(await jetstreamManager(f.nc), f.stores.names, {
      maxRecords: 100,
      maxAgeDays: 1,
      maxBytes: 1_048_576,
    });
    for (let i = 1; i <= 120; i++) await put(f, 'p', { capacity: i, refillPerSecond: 1 });
    const page = await audit(f, '?limit=1000');
    expect(page.entries).toHaveLength(100);
    expect(page.entries[0]!.after?.capacity).toBe(120);
    expect(page.entries.at(-1)!.after?.capacity).toBe(21);
    expect(page.next).toBeNull();
  });
});

describe('coordinator allocations and regions', () => {
  const summary: AllocationSummary = {
    policy: 'writes',
    version: 1,
    epoch: 7,
    shares: { us: 0.5, eu: 0.3, ap: 0.2 },
    leases: {
      us: { expiresAt: '2030-01-01T00:00:10.000Z', acked: true },
      eu: { expiresAt: '2030-01-01T00:00:10.000Z', acked: false },
    },
    overrides: [
      { subject: 'tenant-9', shares: { us: 0.9, eu: 0.05, ap: 0.05 }, expiresAt: '2030-01-01T00:01:00.000Z' },
    ],
  };
  const us: RegionSummary = {
    region: 'us',
    lastReportAt: '2030-01-01T00:00:00.500Z',
    agents: 2,
    reportLagMs: 120,
  };

  it('shows what the engine port holds, and every configured region', async () => {
    const engine: AllocationsReader = { allocations: () => [summary], regions: () => [us] };
    await using f = await coordinatorFixture({ allocations: engine });
    const a = await f.app.inject({ url: '/v1/allocations', headers: reader });
    expect(a.statusCode).toBe(200);
    expect(a.json()).toEqual({ policies: [summary] });
    const r = await f.app.inject({ url: '/v1/regions', headers: reader });
    expect(r.json()).toEqual({
      regions: [
        us,
        { region: 'eu', lastReportAt: null, agents: 0, reportLagMs: null },
        { region: 'ap', lastReportAt: null, agents: 0, reportLagMs: null },
      ],
    });
    expect((await f.app.inject({ url: '/v1/allocations' })).statusCode).toBe(401);
  });

  it('is empty until an engine is wired in', async () => {
    await using f = await coordinatorFixture();
    expect((await f.app.inject({ url: '/v1/allocations', headers: reader })).json()).toEqual({
      policies: [],
    });
  });

  it('masks an engine failure as a 500 problem without internals', async () => {
    const engine: AllocationsReader = {
      allocations: () => {
        throw new Error('secret internal detail');
      },
      regions: () => [],
    };
    await using f = await coordinatorFixture({ allocations: engine });
    const r = await f.app.inject({ url: '/v1/allocations', headers: reader });
    expect(r.statusCode).toBe(500);
    expect(r.json()).toMatchObject({ code: 'COORD_ERR_INTERNAL', detail: 'Internal error' });
    expect(r.body).not.toContain('secret');
  });
});

describe('coordinator docs, probes and metrics', () => {
  it('documents every route in the OpenAPI document generated from the zod schemas', async () => {
    await using f = await coordinatorFixture();
    const r = await f.app.inject({ url: '/docs/json' });
    expect(r.statusCode).toBe(200);
    const doc = r.json<{
      openapi: string;
      paths: Record<string, Record<string, { security?: unknown; requestBody?: unknown }>>;
      components: { schemas: Record<string, unknown>; securitySchemes: Record<string, unknown> };
    }>();
    expect(doc.openapi).toBe('3.1.0');
    const routes = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`),
    );
    expect(routes.sort()).toEqual(
      [
        'GET /healthz',
        'GET /readyz',
        'GET /metrics',
        'GET /v1/policies',
        'GET /v1/policies/{name}',
        'PUT /v1/policies/{name}',
        'DELETE /v1/policies/{name}',
        'PATCH /v1/policies/{name}/budget',
        'GET /v1/audit',
        'GET /v1/backup',
        'POST /v1/restore',
        'GET /v1/allocations',
        'GET /v1/allocations/history',
        'GET /v1/regions',
      ].sort(),
    );
    expect(doc.paths['/v1/policies/{name}']!['put']!.security).toEqual([{ bearerAuth: [] }]);
    expect(JSON.stringify(doc.paths['/v1/policies/{name}']!['put']!.requestBody)).toContain(
      'refillPerSecond',
    );
    expect(Object.keys(doc.components.schemas)).toEqual(expect.arrayContaining(['Policy', 'Problem']));
    const refs = [...r.body.matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g)].map((m) => m[1]!);
    expect(refs.length).toBeGreaterThan(0);
    for (const ref of refs) expect(doc.components.schemas, ref).toHaveProperty(ref);
    expect(doc.components.securitySchemes).toEqual({ bearerAuth: { type: 'http', scheme: 'bearer' } });

    const page = await f.app.inject({ url: '/docs' });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toContain('text/html');
    expect(page.body).toContain('swagger');
  });

  it('answers healthz, readyz (not ready once draining) and counts requests by route', async () => {
    await using f = await coordinatorFixture();
    expect((await f.app.inject({ url: '/healthz' })).json()).toEqual({ status: 'ok' });
    expect((await f.app.inject({ url: '/readyz' })).json()).toEqual({ ready: true, reasons: [] });
    await put(f, 'p', { capacity: 1, refillPerSecond: 1 });
    await f.app.inject({ url: '/v1/policies/p', headers: reader });
    await f.app.inject({ url: '/v1/policies/zzz', headers: reader });
    await f.app.inject({ url: '/nowhere' });
    expect(
      await metric(f, 'qp_coord_http_requests_total{route="/v1/policies/:name",method="PUT",status="201"}'),
    ).toBe(1);
    expect(
      await metric(f, 'qp_coord_http_requests_total{route="/v1/policies/:name",method="GET",status="200"}'),
    ).toBe(1);
    expect(
      await metric(f, 'qp_coord_http_requests_total{route="/v1/policies/:name",method="GET",status="404"}'),
    ).toBe(1);
    expect(await metric(f, 'qp_coord_problems_total{code="COORD_ERR_POLICY_NOT_FOUND"}')).toBe(1);
    expect(await metric(f, 'qp_coord_problems_total{code="COORD_ERR_ROUTE_NOT_FOUND"}')).toBe(1);
    expect(await metric(f, 'qp_coord_policies')).toBe(1);
    expect(await metric(f, 'qp_coord_policy_changes_total{kind="create"}')).toBe(1);

    f.app.lifecycle.beginDrain();
    const ready = await f.app.inject({ url: '/readyz' });
    expect(ready.statusCode).toBe(503);
    expect(ready.json()).toEqual({ ready: false, reasons: ['draining'] });
    const refused = await f.app.inject({ url: '/v1/policies', headers: reader });
    expect(refused.statusCode).toBe(503);
    expect(refused.json()).toMatchObject({ code: 'COORD_ERR_NOT_READY' });
  });
});
