/**
 * Each policy a restore creates is audited as a `create` with the request id `<request id>:<policy name>`. The
 * request id may be the client's own X-Request-Id (up to 128 characters) and the name up to 64, but an audit
 * record's requestId is at most 128 (AuditRecord): the records were written and then skipped by every read as
 * invalid (qp_coord_bad_entries_total{where="audit"}), so the restore's creates were missing from GET /v1/audit,
 * from `quotaplane audit` and from every later backup.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  admin,
  coordinatorFixture,
  reader,
  type CoordinatorFixture,
} from '../../helpers/coordinator-fixture.js';

let f: CoordinatorFixture;
beforeAll(async () => {
  f = await coordinatorFixture();
});
afterAll(async () => {
  await f?.close();
});

describe('a restore under a long X-Request-Id', () => {
  it('audits every create it makes, readable in the trail', async () => {
    const name = 'restored-policy-with-a-rather-long-name';
    const requestId = `trace-${'a'.repeat(100)}`;
    const r = await f.app.inject({
      method: 'POST',
      url: '/v1/restore',
      headers: { ...admin, 'content-type': 'application/json', 'x-request-id': requestId },
      payload: JSON.stringify({
        format: 'quotaplane-backup',
        version: 1,
        exportedAt: new Date().toISOString(),
        policies: [{ name, capacity: 5, refillPerSecond: 1 }],
        audit: [],
      }),
    });
    expect(r.statusCode, r.body).toBe(200);
    expect(r.headers['x-request-id']).toBe(requestId);
    const trail = (await f.app.inject({ url: `/v1/audit?policy=${name}`, headers: reader })).json<{
      entries: { action: string; requestId: string }[];
    }>();
    expect(trail.entries.map((e) => e.action)).toEqual(['create']);
    expect(trail.entries[0]!.requestId.length).toBeLessThanOrEqual(128);
    expect(trail.entries[0]!.requestId.endsWith(`:${name}`)).toBe(true);
    const metrics = (await f.app.inject({ url: '/metrics' })).body;
    expect(metrics).not.toMatch(/qp_coord_bad_entries_total\{where="audit"\} [1-9]/);
  });
});
