/**
 * Back up and restore, on real NATS: `quotaplane backup` of a coordinator with policies and an audit trail,
 * `quotaplane restore` into an empty one (another namespace: an empty stack), the same policies and history
 * after; a bad, partial or conflicting document refused with a 4xx and its stable code, nothing written.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditResponse } from '../../../core/wire/admin.js';
import { startCoordinator, type RunningCoordinator } from '../../../coordinator/server.js';
import { ADMIN_TOKEN, READ_TOKEN, testConfig, uniqueNamespace } from '../../helpers/coordinator-fixture.js';
import { cli } from '../../helpers/cli-runner.js';

let source: RunningCoordinator;
let dir: string;
const started: RunningCoordinator[] = [];

async function coordinator(): Promise<RunningCoordinator> {
  const c = await startCoordinator(testConfig({ namespace: uniqueNamespace() }));
  started.push(c);
  return c;
}

async function api(c: RunningCoordinator, method: string, path: string, body?: unknown, token = ADMIN_TOKEN) {
  const res = await fetch(`${c.url}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
    },
    body: body === undefined ? null : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: (text === '' ? {} : JSON.parse(text)) as Record<string, unknown> };
}

const env = (c: RunningCoordinator) => ({ QUOTAPLANE_URL: c.url, QUOTAPLANE_TOKEN: ADMIN_TOKEN });
const policies = async (c: RunningCoordinator) => (await api(c, 'GET', '/v1/policies')).body['policies'];
const trail = async (c: RunningCoordinator) =>
  ((await api(c, 'GET', '/v1/audit?limit=1000')).body as unknown as AuditResponse).entries;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'qp-backup-'));
  source = await coordinator();
  expect(
    (await api(source, 'PUT', '/v1/policies/exports.daily', { capacity: 100, refillPerSecond: 2 })).status,
  ).toBe(201);
  expect(
    (
      await api(source, 'PUT', '/v1/policies/payments', {
        capacity: 5,
        refillPerSecond: 1,
        mode: 'strict',
        homeRegion: 'eu',
      })
    ).status,
  ).toBe(201);
  expect((await api(source, 'PUT', '/v1/policies/gone', { capacity: 1, refillPerSecond: 1 })).status).toBe(
    201,
  );
  expect((await api(source, 'PATCH', '/v1/policies/exports.daily/budget', { capacity: 150 })).status).toBe(
    200,
  );
  expect((await api(source, 'DELETE', '/v1/policies/gone')).status).toBe(204);
}, 30_000);

afterAll(async () => {
  for (const c of started) await c.stop().catch(() => undefined);
  rmSync(dir, { recursive: true, force: true });
});

describe('backup and restore', { timeout: 30_000 }, () => {
  it('round-trips policies and the audit trail into an empty coordinator through the CLI', async () => {
    const file = join(dir, 'backup.json');
    const backup = await cli(['backup', '--out', file], { env: env(source) });
    expect(backup.stderr).toBe('');
    expect(backup.status).toBe(0);
    expect(backup.stdout).toBe(`wrote ${file}: 2 policies, 5 audit records\n`);
    const doc = JSON.parse(readFileSync(file, 'utf8')) as {
      policies: unknown[];
      audit: { action: string }[];
    };
    expect(doc.audit.map((r) => r.action)).toEqual(['create', 'create', 'create', 'budget', 'delete']);

    const target = await coordinator();
    const restore = await cli(['restore', file], { env: env(target) });
    expect(restore.stderr).toBe('');
    expect(restore.status).toBe(0);
    expect(restore.stdout).toBe('restored 2 policies and 5 audit records\n');

    expect(await policies(target)).toEqual(await policies(source));
    const restored = await trail(target);
    // Newest first: the two creates of the restore, then the source's history as it was.
    expect(restored.map((e) => [e.action, e.policy, e.actor.name])).toEqual([
      ['create', 'payments', 'admin'],
      ['create', 'exports.daily', 'admin'],
      ...(await trail(source)).map((e) => [e.action, e.policy, e.actor.name]),
    ]);
    // A backup of the restored coordinator holds the same policies.
    const again = await api(target, 'GET', '/v1/backup', undefined, READ_TOKEN);
    expect(again.status).toBe(200);
    expect(again.body['policies']).toEqual(doc.policies);
  });

  it('refuses a bad, partial or conflicting backup with a 4xx and a stable code, and writes nothing', async () => {
    const good = (await api(source, 'GET', '/v1/backup')).body;
    const empty = await coordinator();
    const refusals: [string, unknown, number, string][] = [
      ['partial JSON', JSON.stringify(good).slice(0, 60), 400, 'COORD_ERR_MALFORMED_BODY'],
      ['no audit', { ...good, audit: undefined }, 400, 'COORD_ERR_VALIDATION'],
      ['another format', { ...good, format: 'other' }, 400, 'COORD_ERR_VALIDATION'],
      [
        'one bad policy among good ones',
        { ...good, policies: [...(good['policies'] as unknown[]), { name: 'bad', capacity: -1 }] },
        400,
        'COORD_ERR_VALIDATION',
      ],
      [
        'a name twice',
        { ...good, policies: [...(good['policies'] as unknown[]), (good['policies'] as unknown[])[0]] },
        400,
        'COORD_ERR_VALIDATION',
      ],
    ];
    for (const [what, body, status, code] of refusals) {
      const r = await api(empty, 'POST', '/v1/restore', body);
      expect([what, r.status, r.body['code']]).toEqual([what, status, code]);
    }
    const bad = await api(empty, 'POST', '/v1/restore', {
      ...good,
      policies: [{ name: 'bad', capacity: -1, refillPerSecond: 1 }],
    });
    expect((bad.body['errors'] as { path: string }[]).map((e) => e.path)).toEqual(['policies.0.capacity']);
    const readOnly = await api(empty, 'POST', '/v1/restore', good, READ_TOKEN);
    expect([readOnly.status, readOnly.body['code']]).toEqual([403, 'COORD_ERR_FORBIDDEN']);
    // Nothing of any refused document was written.
    expect(await policies(empty)).toEqual([]);
    expect((await trail(empty)).filter((e) => e.action !== 'refused')).toEqual([]);

    // Into a coordinator that holds policies: refused whole.
    const before = await trail(source);
    const conflict = await api(source, 'POST', '/v1/restore', good);
    expect([conflict.status, conflict.body['code']]).toEqual([409, 'COORD_ERR_RESTORE_NOT_EMPTY']);
    expect((await trail(source)).filter((e) => e.action !== 'refused')).toEqual(
      before.filter((e) => e.action !== 'refused'),
    );

    // The CLI says so too: a partial file is not sent; the API's refusal exits 1 with its code.
    const partial = join(dir, 'partial.json');
    writeFileSync(partial, JSON.stringify(good).slice(0, 100));
    const cut = await cli(['restore', partial], { env: env(empty) });
    expect(cut.status).toBe(2);
    expect(cut.stderr).toContain('is not JSON (a partial file?)');
    const conflicting = join(dir, 'good.json');
    writeFileSync(conflicting, JSON.stringify(good));
    const refused = await cli(['restore', conflicting], { env: env(source) });
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain('COORD_ERR_RESTORE_NOT_EMPTY');
  });

  it('two concurrent restores into an empty coordinator: one wins whole, the other is a 409 that wrote nothing', async () => {
    const good = (await api(source, 'GET', '/v1/backup')).body as { audit: { requestId: string }[] };
    // Two deployments: different policies (one name in common, with other limits) and different histories.
    const deployment = (names: string[], capacity: number, tag: string) => ({
      ...good,
      policies: names.map((name) => ({ name, capacity, refillPerSecond: 1 })),
      audit: good.audit.map((r) => ({ ...r, requestId: `${r.requestId}-${tag}` })),
    });
    const first = deployment(['a', 'b', 'c'], 10, 'first');
    const second = deployment(['d', 'e', 'c'], 99, 'second');
    for (let round = 0; round < 3; round++) {
      const empty = await coordinator();
      const answers = await Promise.all([
        api(empty, 'POST', '/v1/restore', first),
        api(empty, 'POST', '/v1/restore', second),
      ]);
      expect(answers.map((a) => a.status).sort()).toEqual([200, 409]);
      const loser = answers.find((a) => a.status === 409)!;
      expect(loser.body['code']).toBe('COORD_ERR_RESTORE_NOT_EMPTY');
      const won = answers[0].status === 200 ? first : second;
      // Exactly the winner's policies, and only its history.
      const held = (await policies(empty)) as { name: string; capacity: number }[];
      expect(held.map((p) => [p.name, p.capacity])).toEqual(
        won.policies.map((p) => [p.name, p.capacity]).sort(([x], [y]) => String(x).localeCompare(String(y))),
      );
      const history = (await trail(empty)).filter((e) => e.action !== 'refused');
      const tag = won === first ? '-first' : '-second';
      // Newest first: the winner's creates, then its imported history (none of the loser's).
      expect(
        history.map((e) => (e.requestId.endsWith(tag) ? 'imported' : `${e.action} ${e.policy}`)),
      ).toEqual([
        ...won.policies.map((p) => `create ${p.name}`).reverse(),
        ...won.audit.map(() => 'imported'),
      ]);
    }
  });
});
