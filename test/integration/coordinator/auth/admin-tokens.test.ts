/**
 * Named admin tokens on a real NATS: several tokens per role, each change audited with the token's name and the
 * caller's address; refused requests audited too (grouped per source and reason, capped); `/metrics` behind the
 * read token or on a listener of its own.
 */
import { describe, expect, it } from 'vitest';
import type { AuditEntry, AuditResponse } from '../../../../core/wire/admin.js';
import { startCoordinator } from '../../../../coordinator/server.js';
import {
  admin,
  coordinatorFixture,
  reader,
  testConfig,
  type CoordinatorFixture,
} from '../../../helpers/coordinator-fixture.js';

const ALICE = 'alice-token-0123456789abcd';
const CI = 'ci-token-0123456789abcdefgh';
const GRAFANA = 'grafana-token-0123456789ab';
const tokens = [
  { name: 'alice', role: 'write' as const, token: ALICE },
  { name: 'ci', role: 'write' as const, token: CI },
  { name: 'grafana', role: 'read' as const, token: GRAFANA },
];
const bearer = (t: string) => ({ authorization: `Bearer ${t}`, 'content-type': 'application/json' });

async function trail(f: CoordinatorFixture): Promise<AuditEntry[]> {
  return (await f.app.inject({ url: '/v1/audit?limit=100', headers: reader })).json<AuditResponse>().entries;
}

describe('named admin tokens', { timeout: 30_000 }, () => {
  it('several tokens per role; the audit trail names the token and the source address', async () => {
    await using f = await coordinatorFixture({ tokens });
    const put = (token: string, capacity: number) =>
      f.app.inject({
        method: 'PUT',
        url: '/v1/policies/exports',
        headers: bearer(token),
        payload: JSON.stringify({ capacity, refillPerSecond: 1 }),
      });
    expect((await put(ALICE, 10)).statusCode).toBe(201);
    expect((await put(CI, 20)).statusCode).toBe(200);
    const read = await f.app.inject({ url: '/v1/policies/exports', headers: bearer(GRAFANA) });
    expect(read.json()).toMatchObject({ capacity: 20 });
    const changes = (await trail(f)).filter((e) => e.action !== 'refused');
    expect(changes.map((e) => [e.action, e.actor, e.source])).toEqual([
      ['replace', { role: 'write', name: 'ci' }, '127.0.0.1'],
      ['create', { role: 'write', name: 'alice' }, '127.0.0.1'],
    ]);
  });

  it('refused requests are audited: who (if known), why, from where and how many, one record per group', async () => {
    await using f = await coordinatorFixture({ tokens });
    const body = JSON.stringify({ capacity: 10, refillPerSecond: 1 });
    for (let i = 0; i < 3; i++) {
      const r = await f.app.inject({
        method: 'PUT',
        url: '/v1/policies/exports',
        headers: bearer('wrong-token-0123456789abcd'),
        payload: body,
      });
      expect(r.statusCode).toBe(401);
    }
    expect((await f.app.inject({ url: '/v1/policies' })).statusCode).toBe(401);
    for (let i = 0; i < 2; i++) {
      const r = await f.app.inject({
        method: 'DELETE',
        url: '/v1/policies/exports',
        headers: { authorization: `Bearer ${GRAFANA}` },
      });
      expect(r.statusCode).toBe(403);
    }
    await f.app.refusals.flush();
    const refused = (await trail(f)).filter((e) => e.action === 'refused');
    const byReason = Object.fromEntries(refused.map((e) => [e.refused!.reason, e]));
    expect(refused).toHaveLength(3);
    expect(byReason['invalid']).toMatchObject({
      actor: { role: 'none', name: 'invalid' },
      policy: 'exports',
      source: '127.0.0.1',
      refused: { method: 'PUT', route: '/v1/policies/:name', attempts: 3 },
    });
    expect(byReason['missing']).toMatchObject({
      actor: { role: 'none', name: 'missing' },
      refused: { method: 'GET', route: '/v1/policies', attempts: 1 },
    });
    expect(byReason['missing']!.policy).toBeUndefined();
    expect(byReason['forbidden']).toMatchObject({
      actor: { role: 'read', name: 'grafana' },
      policy: 'exports',
      refused: { method: 'DELETE', attempts: 2 },
    });
    // Nothing was changed by any of them.
    expect((await f.app.inject({ url: '/v1/policies', headers: admin })).json()).toEqual({ policies: [] });
  });

  it('a flood of refusals is capped per minute: the rest is counted, not written', async () => {
    await using f = await coordinatorFixture({ tokens, refusalsPerMinute: 1 });
    await f.app.inject({ url: '/v1/policies' });
    await f.app.inject({ url: '/v1/policies', headers: { authorization: 'Bearer nope-0123456789abcdef' } });
    await f.app.refusals.flush();
    expect((await trail(f)).filter((e) => e.action === 'refused')).toHaveLength(1);
    const text = (await f.app.inject({ url: '/metrics' })).body;
    expect(text).toMatch(/^qp_coord_audit_refusals_dropped_total 1$/m);
    expect(text).toMatch(/^qp_coord_auth_failures_total\{reason="invalid"\} 1$/m);
  });
});

describe('/metrics', { timeout: 30_000 }, () => {
  it('behind the read token with QP_METRICS_AUTH=read', async () => {
    await using f = await coordinatorFixture({ tokens, metricsAuth: 'read' });
    expect((await f.app.inject({ url: '/metrics' })).statusCode).toBe(401);
    const ok = await f.app.inject({ url: '/metrics', headers: { authorization: `Bearer ${GRAFANA}` } });
    expect(ok.statusCode).toBe(200);
    expect(ok.body).toContain('qp_coord_http_requests_total');
  });

  it('on a listener of its own with QP_METRICS_PORT, and no longer on the admin listener', async () => {
    const coordinator = await startCoordinator({
      ...testConfig(),
      metricsListener: { host: '127.0.0.1', port: 0 },
    });
    try {
      expect(coordinator.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const scraped = await fetch(`${coordinator.metricsUrl}/metrics`);
      expect(scraped.status).toBe(200);
      expect(await scraped.text()).toContain('qp_coord_policies');
      expect((await fetch(`${coordinator.url}/metrics`)).status).toBe(404);
    } finally {
      await coordinator.stop();
    }
  });
});
