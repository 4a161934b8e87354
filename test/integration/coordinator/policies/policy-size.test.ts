/**
 * A policy whose stored JSON does not fit the policies bucket's value limit (16 KiB, headers of the conditional
 * write included) is the caller's mistake: a 400 listing it, nothing written. It used to reach JetStream, which
 * refused it ("message size exceeds maximum allowed"), and the API answered 503 COORD_ERR_STORE_UNAVAILABLE with
 * Retry-After: 1 for a request no retry can ever store; a restore holding one checked it as valid, appended the
 * audit records and created the policies before it, then failed half-way, so the retry was a 409.
 */
import { afterEach, describe, expect, it } from 'vitest';
import {
  admin,
  coordinatorFixture,
  reader,
  type CoordinatorFixture,
} from '../../../helpers/coordinator-fixture.js';

const json = { ...admin, 'content-type': 'application/json' };

/** A token-bucket body with named subjects, padded to exactly `bytes` bytes of JSON. */
function bodyOf(bytes: number): Record<string, unknown> {
  const subjects: Record<string, string> = {};
  const body = {
    capacity: 10,
    refillPerSecond: 1,
    classes: { gold: { capacity: 20, refillPerSecond: 2 } },
    subjects,
  };
  for (let i = 0; JSON.stringify(body).length < bytes - 40; i++) subjects[`tenant-${i}`] = 'gold';
  const pad = bytes - JSON.stringify(body).length - ',"":"gold"'.length;
  subjects[`z${'x'.repeat(pad - 1)}`] = 'gold';
  expect(JSON.stringify(body).length).toBe(bytes);
  return body;
}

let f: CoordinatorFixture | undefined;
afterEach(async () => {
  await f?.close();
  f = undefined;
});

describe('a policy too large for the policies bucket', () => {
  it('is a 400 naming the size, within the default body limit, and nothing is written', async () => {
    f = await coordinatorFixture();
    // 16,340 bytes: under QP_BODY_LIMIT_BYTES (16,384), over the bucket's limit once the name and defaults are added.
    const r = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/big',
      headers: json,
      payload: JSON.stringify(bodyOf(16_340)),
    });
    expect(r.statusCode, r.body).toBe(400);
    expect(r.json()).toMatchObject({ code: 'COORD_ERR_VALIDATION' });
    expect(r.headers['retry-after']).toBeUndefined();
    expect((await f.app.inject({ url: '/v1/policies', headers: reader })).json()).toEqual({ policies: [] });
  });

  it('in a restore is refused whole before anything is written', async () => {
    f = await coordinatorFixture();
    const at = new Date().toISOString();
    const backup = {
      format: 'quotaplane-backup',
      version: 1,
      exportedAt: at,
      policies: [
        { name: 'small', capacity: 5, refillPerSecond: 1 },
        { name: 'big', ...bodyOf(20_000) },
      ],
      audit: [
        {
          at,
          actor: { role: 'write', name: 'admin' },
          action: 'delete',
          policy: 'gone',
          revision: 3,
          before: null,
          after: null,
          requestId: 'old-1',
        },
      ],
    };
    const r = await f.app.inject({
      method: 'POST',
      url: '/v1/restore',
      headers: json,
      payload: JSON.stringify(backup),
    });
    expect(r.statusCode, r.body).toBe(400);
    expect(r.json()).toMatchObject({ code: 'COORD_ERR_VALIDATION' });
    expect(r.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual(['policies.1']);
    expect((await f.app.inject({ url: '/v1/policies', headers: reader })).json()).toEqual({ policies: [] });
    expect((await f.app.inject({ url: '/v1/audit', headers: reader })).json()).toMatchObject({ entries: [] });
  });
});
