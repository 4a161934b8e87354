/**
 * The admin API's policy routes against a real NATS JetStream: CRUD, defaults, ETag / If-Match, budget changes,
 * limits, and bad input that changes nothing.
 */
import { describe, expect, it } from 'vitest';
import type { PolicyChange } from '../../../../coordinator/policies/policy-store.js';
import { policyKey } from '../../../../core/wire/kv.js';
import {
  admin,
  coordinatorFixture,
  eventually,
  reader,
  type CoordinatorFixture,
} from '../../../helpers/coordinator-fixture.js';

const json = { 'content-type': 'application/json' };

function put(f: CoordinatorFixture, name: string, body: unknown, headers: Record<string, string> = {}) {
  return f.app.inject({
    method: 'PUT',
    url: `/v1/policies/${name}`,
    headers: { ...admin, ...json, ...headers },
    payload: JSON.stringify(body),
  });
}

function patch(f: CoordinatorFixture, name: string, body: unknown, headers: Record<string, string> = {}) {
  return f.app.inject({
    method: 'PATCH',
    url: `/v1/policies/${name}/budget`,
    headers: { ...admin, ...json, ...headers },
    payload: JSON.stringify(body),
  });
}

/** Everything a request could have changed: the bucket's last revision and the audit trail's length. */
async function state(f: CoordinatorFixture): Promise<{ revision: number; audit: number; keys: string[] }> {
  const status = await f.stores.kv.status();
  const audit = await f.stores.audit.read({ limit: 1000 });
  const keys: string[] = [];
  for await (const k of await f.stores.kv.keys()) keys.push(k);
  return { revision: status.streamInfo.state.last_seq, audit: audit.entries.length, keys: keys.sort() };
}

describe('coordinator policies API', () => {
  it('creates a policy with every default filled, then reads, lists and replaces it', async () => {
    await using f = await coordinatorFixture();
    const created = await put(f, 'writes', { capacity: 10, refillPerSecond: 2 });
    expect(created.statusCode).toBe(201);
    expect(created.headers.etag).toBe('"1"');
    expect(created.headers.location).toBe('/v1/policies/writes');
    const filled = {
      name: 'writes',
      kind: 'token_bucket',
      capacity: 10,
      refillPerSecond: 2,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 60,
      version: 1,
    };
    expect(created.json()).toEqual(filled);

    const got = await f.app.inject({ url: '/v1/policies/writes', headers: reader });
    expect(got.statusCode).toBe(200);
    expect(got.headers.etag).toBe('"1"');
    expect(got.json()).toEqual(filled);

    const replaced = await put(f, 'writes', { capacity: 20, refillPerSecond: 2, mode: 'local' });
    expect(replaced.statusCode).toBe(200);
    expect(replaced.headers.etag).toBe('"2"');
    expect(replaced.json()).toMatchObject({ capacity: 20, mode: 'local', idleTtlSeconds: 60 });

    await put(f, 'a.reads', { capacity: 5, refillPerSecond: 5 });
    const list = await f.app.inject({ url: '/v1/policies', headers: reader });
    expect(list.statusCode).toBe(200);
    expect(list.json<{ policies: { name: string }[] }>().policies.map((p) => p.name)).toEqual([
      'a.reads',
      'writes',
    ]);
  });

  it('creates a sliding-log policy: its rate is derived, a budget change moves the limit, misfits are refused', async () => {
    await using f = await coordinatorFixture();
    const created = await put(f, 'login-guesses', { kind: 'sliding_log', capacity: 5, windowSeconds: 600 });
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json()).toEqual({
      name: 'login-guesses',
      kind: 'sliding_log',
      capacity: 5,
      refillPerSecond: 0.00833, // 5 / 600, shown to 3 significant digits (core/admin-numbers.ts)
      windowSeconds: 600,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 600,
      version: 1,
    });
    // What the API shows can be sent back (derived defaults then pinned, as for any policy): the same policy.
    const { name: _name, ...shown } = created.json<Record<string, unknown>>();
    const again = await put(f, 'login-guesses', shown);
    expect(again.statusCode, again.body).toBe(200);
    expect(again.json()).toEqual(created.json());
    const budget = await patch(f, 'login-guesses', { capacity: 10 });
    expect(budget.statusCode, budget.body).toBe(200);
    expect(budget.json()).toMatchObject({ capacity: 10, refillPerSecond: 0.0167, windowSeconds: 600 });
    const before = await state(f);
    const bad = await put(f, 'login-guesses', { kind: 'sliding_log', capacity: 5, onStoreFailure: 'local' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json<{ code: string }>().code).toBe('COORD_ERR_VALIDATION');
    expect(await state(f)).toEqual(before);
  });

  it('a concurrency or daily policy: its derived rate shown clean, re-derived by a budget change, sent back as shown', async () => {
    await using f = await coordinatorFixture();
    for (const [name, body, shownRate, afterRate] of [
      ['uploads-running', { kind: 'concurrency', capacity: 10, leaseSeconds: 30 }, 0.333, 0.667],
      ['daily-exports', { kind: 'daily', capacity: 1000 }, 0.0116, 0.0231],
    ] as const) {
      const created = await put(f, name, body);
      expect(created.statusCode, created.body).toBe(201);
      expect(created.json<{ refillPerSecond: number }>().refillPerSecond).toBe(shownRate);
      // What the API shows can be sent back, and a budget change afterwards re-derives the rate from capacity.
      const { name: _name, ...shown } = created.json<Record<string, unknown>>();
      const back = await put(f, name, shown);
      expect(back.statusCode, back.body).toBe(200);
      const budget = await patch(f, name, { capacity: 2 * body.capacity });
      expect(budget.statusCode, budget.body).toBe(200);
      expect(budget.json()).toMatchObject({ capacity: 2 * body.capacity, refillPerSecond: afterRate });
    }
  });

  it('a sliding-log or daily policy with classes: class rates shown rounded, and what GET answers can be PUT back', async () => {
    await using f = await coordinatorFixture();
    for (const [name, body, shownRate, classRate] of [
      [
        'login-tiers',
        { kind: 'sliding_log', capacity: 5, windowSeconds: 600, classes: { gold: { capacity: 7 } } },
        0.00833,
        0.0117, // 7 / 600 = 0.011666…
      ],
      [
        'export-tiers',
        { kind: 'daily', capacity: 1000, classes: { gold: { capacity: 7 } } },
        0.0116,
        0.000081,
      ],
    ] as const) {
      const created = await put(f, name, body);
      expect(created.statusCode, created.body).toBe(201);
      expect(created.json()).toMatchObject({
        refillPerSecond: shownRate,
        classes: { gold: { capacity: 7, refillPerSecond: classRate, maxCost: 1 } },
      });
      // GET → PUT of what it answered (derived defaults then pinned, as for any policy): the same policy.
      const got = await f.app.inject({ url: `/v1/policies/${name}`, headers: reader });
      expect(got.json()).toEqual(created.json());
      const { name: _name, ...shown } = got.json<Record<string, unknown>>();
      const back = await put(f, name, shown);
      expect(back.statusCode, back.body).toBe(200);
      expect(back.json()).toEqual(created.json());
      // The stored spec keeps no derived rate, the class's included: a later change re-derives it.
      const backup = await f.app.inject({ url: '/v1/backup', headers: reader });
      const stored = backup
        .json<{ policies: Record<string, unknown>[] }>()
        .policies.find((p) => p['name'] === name);
      expect(stored).not.toHaveProperty('refillPerSecond');
      expect(stored?.['classes']).toEqual({ gold: { capacity: 7, maxCost: 1 } });
      const before = await state(f);
      // A class rate that is neither the derived one nor as shown is refused.
      const wrong = await put(f, name, { ...body, classes: { gold: { capacity: 7, refillPerSecond: 1 } } });
      expect(wrong.statusCode).toBe(400);
      expect(wrong.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
        'body.classes.gold.refillPerSecond',
      ]);
      expect(await state(f)).toEqual(before);
    }
  });

  it('creates a concurrency policy with its lease; a strict one, or a lease on another kind, is refused', async () => {
    await using f = await coordinatorFixture();
    const created = await put(f, 'exports-running', { kind: 'concurrency', capacity: 30, leaseSeconds: 300 });
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json()).toEqual({
      name: 'exports-running',
      kind: 'concurrency',
      capacity: 30,
      refillPerSecond: 0.1,
      leaseSeconds: 300,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 300,
      version: 1,
    });
    const before = await state(f);
    const strict = await put(f, 'exports-running', {
      kind: 'concurrency',
      capacity: 30,
      leaseSeconds: 300,
      mode: 'strict',
      homeRegion: 'us',
    });
    expect(strict.statusCode).toBe(400);
    const misplaced = await put(f, 'exports-running', {
      capacity: 30,
      refillPerSecond: 1,
      leaseSeconds: 300,
    });
    expect(misplaced.statusCode).toBe(400);
    expect(misplaced.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
      'body.leaseSeconds',
    ]);
    expect(await state(f)).toEqual(before);
  });

  it('subject classes: stored, versioned and audited like the rest of the policy; a class that does not hold is refused', async () => {
    await using f = await coordinatorFixture();
    const spec = {
      capacity: 10,
      refillPerSecond: 1,
      classes: { enterprise: { capacity: 100, refillPerSecond: 10 } },
      subjects: { 'tenant-42': 'enterprise' },
    };
    const created = await put(f, 'api', spec);
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json()).toMatchObject({
      classes: { enterprise: { capacity: 100, refillPerSecond: 10, maxCost: 1 } },
      subjects: { 'tenant-42': 'enterprise' },
    });
    const before = await state(f);
    const bad = await put(f, 'api', {
      ...spec,
      classes: { enterprise: { capacity: 100 } },
      subjects: { x: 'gold' },
    });
    expect(bad.statusCode).toBe(400);
    expect(
      bad
        .json<{ errors: { path: string }[] }>()
        .errors.map((e) => e.path)
        .sort(),
    ).toEqual(['body.classes.enterprise.refillPerSecond', 'body.subjects.x']);
    expect(await state(f)).toEqual(before);
    const upgraded = await put(f, 'api', {
      ...spec,
      subjects: { 'tenant-42': 'enterprise', 'tenant-7': 'enterprise' },
    });
    expect(upgraded.statusCode).toBe(200);
    const after = await state(f);
    expect(after.audit).toBe(before.audit + 1);
    expect(after.revision).toBeGreaterThan(before.revision);
  });

  it('subject-creation cap: stored with its flood answer filled, audited; bad values refused with every problem', async () => {
    await using f = await coordinatorFixture();
    const spec = { capacity: 10, refillPerSecond: 1, newSubjects: { perMinute: 100 } };
    const created = await put(f, 'signup', spec);
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json()).toMatchObject({ newSubjects: { perMinute: 100, flood: 'deny' } });
    const before = await state(f);
    const bad = await put(f, 'signup', {
      ...spec,
      shards: 2,
      newSubjects: { perMinute: 0, flood: 'later' },
    });
    expect(bad.statusCode).toBe(400);
    expect(
      bad
        .json<{ errors: { path: string }[] }>()
        .errors.map((e) => e.path)
        .sort(),
    ).toEqual(['body.newSubjects.flood', 'body.newSubjects.perMinute']);
    const sharded = await put(f, 'signup', { ...spec, shards: 2 });
    expect(sharded.statusCode).toBe(400);
    expect(sharded.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
      'body.newSubjects',
    ]);
    expect(await state(f)).toEqual(before);
    const shared = await put(f, 'signup', { ...spec, newSubjects: { perMinute: 50, flood: 'shared' } });
    expect(shared.statusCode).toBe(200);
    expect(shared.json()).toMatchObject({ newSubjects: { perMinute: 50, flood: 'shared' } });
    expect((await state(f)).audit).toBe(before.audit + 1);
  });

  it('subjectKind ip: stored as sent, answered with its prefixes filled, audited; bad values refused with every problem', async () => {
    await using f = await coordinatorFixture();
    const spec = { capacity: 20, refillPerSecond: 0.05, subjectKind: 'ip', ipv6Prefix: 56 };
    const created = await put(f, 'login-prefix', spec);
    expect(created.statusCode, created.body).toBe(201);
    expect(created.json()).toMatchObject({ subjectKind: 'ip', ipv4Prefix: 32, ipv6Prefix: 56 });
    expect((await f.stores.kv.get(policyKey('login-prefix')))?.json()).toMatchObject({
      subjectKind: 'ip',
      ipv6Prefix: 56,
    });
    expect((await f.stores.kv.get(policyKey('login-prefix')))?.json()).not.toHaveProperty('ipv4Prefix');
    const before = await state(f);
    const bad = await put(f, 'login-prefix', {
      ...spec,
      ipv4Prefix: 4,
      ipv6Prefix: 129,
      classes: { partner: { capacity: 200, refillPerSecond: 1 } },
      subjects: { 'tenant-1': 'partner' },
    });
    expect(bad.statusCode).toBe(400);
    expect(bad.json()).toMatchObject({ code: 'COORD_ERR_VALIDATION' });
    expect(
      bad
        .json<{ errors: { path: string }[] }>()
        .errors.map((e) => e.path)
        .sort(),
    ).toEqual(['body.ipv4Prefix', 'body.ipv6Prefix', 'body.subjects.tenant-1']);
    const named = await put(f, 'login-prefix', {
      ...spec,
      classes: { partner: { capacity: 200, refillPerSecond: 1 } },
      subjects: { 'tenant-1': 'partner' },
    });
    expect(named.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
      'body.subjects.tenant-1',
    ]);
    const orphan = await put(f, 'plain', { capacity: 20, refillPerSecond: 1, ipv6Prefix: 48 });
    expect(orphan.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
      'body.ipv6Prefix',
    ]);
    expect(await state(f)).toEqual(before);
    const wider = await put(f, 'login-prefix', { ...spec, ipv6Prefix: 48 });
    expect(wider.statusCode).toBe(200);
    expect(wider.json()).toMatchObject({ ipv4Prefix: 32, ipv6Prefix: 48 });
    expect((await state(f)).audit).toBe(before.audit + 1);
  });

  it('stores the operator spec: derived defaults stay derived, constant defaults are pinned', async () => {
    await using f = await coordinatorFixture();
    await put(f, 'exports', { capacity: 100, refillPerSecond: 100 / 3600 });
    const entry = await f.stores.kv.get(policyKey('exports'));
    expect(entry?.json()).toEqual({
      name: 'exports',
      capacity: 100,
      refillPerSecond: 100 / 3600,
      mode: 'regional',
      onStoreFailure: 'closed',
      version: 1,
    });
  });

  it('answers a PUT of an identical spec without writing, auditing or emitting', async () => {
    await using f = await coordinatorFixture();
    const changes: PolicyChange[] = [];
    f.stores.policies.onChange((c) => changes.push(c));
    await put(f, 'writes', { capacity: 10, refillPerSecond: 2 });
    const before = await state(f);
    const again = await put(f, 'writes', { capacity: 10, refillPerSecond: 2, mode: 'regional' });
    expect(again.statusCode).toBe(200);
    expect(again.headers.etag).toBe('"1"');
    expect(await state(f)).toEqual(before);
    expect(changes.map((c) => c.kind)).toEqual(['create']);
  });

  it('honours If-Match on PUT, PATCH and DELETE, and If-None-Match: * for create-only', async () => {
    await using f = await coordinatorFixture();
    expect((await put(f, 'p', { capacity: 10, refillPerSecond: 1 }, { 'if-match': '*' })).statusCode).toBe(
      412,
    );
    expect(
      (await put(f, 'p', { capacity: 10, refillPerSecond: 1 }, { 'if-none-match': '*' })).statusCode,
    ).toBe(201);
    const dup = await put(f, 'p', { capacity: 11, refillPerSecond: 1 }, { 'if-none-match': '*' });
    expect(dup.statusCode).toBe(412);
    expect(dup.json()).toMatchObject({ code: 'COORD_ERR_PRECONDITION_FAILED' });

    const stale = await put(f, 'p', { capacity: 12, refillPerSecond: 1 }, { 'if-match': '"999"' });
    expect(stale.statusCode).toBe(412);
    expect(stale.json<{ detail: string }>().detail).toContain('"1"');
    const weak = await put(f, 'p', { capacity: 12, refillPerSecond: 1 }, { 'if-match': 'W/"1"' });
    expect(weak.statusCode).toBe(412);
    const ok = await put(f, 'p', { capacity: 12, refillPerSecond: 1 }, { 'if-match': '"7", "1"' });
    expect(ok.statusCode).toBe(200);
    expect(ok.headers.etag).toBe('"2"');

    expect((await patch(f, 'p', { capacity: 20 }, { 'if-match': '"1"' })).statusCode).toBe(412);
    const patched = await patch(f, 'p', { capacity: 20 }, { 'if-match': '"2"' });
    expect(patched.statusCode).toBe(200);
    expect(patched.headers.etag).toBe('"3"');

    const del = (etag: string) =>
      f.app.inject({ method: 'DELETE', url: '/v1/policies/p', headers: { ...admin, 'if-match': etag } });
    expect((await del('"2"')).statusCode).toBe(412);
    expect((await f.app.inject({ url: '/v1/policies/p', headers: reader })).statusCode).toBe(200);
    // A client that sends Content-Type: application/json on every request, with no body: the DELETE is read as one.
    const typed = await f.app.inject({
      method: 'DELETE',
      url: '/v1/policies/p',
      headers: { ...admin, 'if-match': '"2"', 'content-type': 'application/json' },
    });
    expect(typed.statusCode).toBe(412);
    expect((await del('"3"')).statusCode).toBe(204);
    expect((await f.app.inject({ url: '/v1/policies/p', headers: reader })).statusCode).toBe(404);
    // Without a representation, preconditions do not turn a 404 into a 412 (RFC 9110 §13.2.1).
    expect((await del('"3"')).statusCode).toBe(404);
  });

  it('refuses malformed precondition headers with 400', async () => {
    await using f = await coordinatorFixture();
    const r = await put(f, 'p', { capacity: 10, refillPerSecond: 1 }, { 'if-match': '42' });
    expect(r.statusCode).toBe(400);
    expect(r.json()).toMatchObject({ code: 'COORD_ERR_BAD_PRECONDITION' });
    expect((await state(f)).keys).toEqual([]);
  });

  it('answers 304 to a GET whose If-None-Match still matches', async () => {
    await using f = await coordinatorFixture();
    await put(f, 'p', { capacity: 10, refillPerSecond: 1 });
    const same = await f.app.inject({
      url: '/v1/policies/p',
      headers: { ...reader, 'if-none-match': '"1"' },
    });
    expect(same.statusCode).toBe(304);
    expect(same.body).toBe('');
    const other = await f.app.inject({
      url: '/v1/policies/p',
      headers: { ...reader, 'if-none-match': '"0"' },
    });
    expect(other.statusCode).toBe(200);
  });

  it('re-derives defaulted maxCost and idle TTL on a budget change, keeps explicit ones, and refuses misfits', async () => {
    await using f = await coordinatorFixture();
    await put(f, 'derived', { capacity: 0.5, refillPerSecond: 0.001 });
    // maxCost = min(1, 0.5) = 0.5; TTL = ceil(0.5 / 0.001) = 500 s.
    expect((await f.app.inject({ url: '/v1/policies/derived', headers: reader })).json()).toMatchObject({
      maxCost: 0.5,
      idleTtlSeconds: 500,
    });
    const grown = await patch(f, 'derived', { capacity: 10 });
    expect(grown.statusCode).toBe(200);
    expect(grown.json()).toMatchObject({
      capacity: 10,
      refillPerSecond: 0.001,
      maxCost: 1,
      idleTtlSeconds: 10_000,
    });

    await put(f, 'pinned', { capacity: 10, refillPerSecond: 1, maxCost: 5, idleTtlSeconds: 20 });
    const misfit = await patch(f, 'pinned', { capacity: 40 });
    expect(misfit.statusCode).toBe(422);
    expect(misfit.json()).toMatchObject({
      code: 'COORD_ERR_INVALID_POLICY',
      errors: [{ path: 'idleTtlSeconds' }],
    });
    const fits = await patch(f, 'pinned', { capacity: 15, refillPerSecond: 2 });
    expect(fits.json()).toMatchObject({ capacity: 15, refillPerSecond: 2, maxCost: 5, idleTtlSeconds: 20 });
    const tooSmall = await patch(f, 'pinned', { capacity: 4 });
    expect(tooSmall.statusCode).toBe(422);
    expect(tooSmall.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual(['maxCost']);
    expect((await f.app.inject({ url: '/v1/policies/pinned', headers: reader })).json()).toMatchObject({
      capacity: 15,
    });
  });

  it('validates at write time and lists every problem at once', async () => {
    await using f = await coordinatorFixture({ regions: ['us', 'eu'] });
    const r = await put(f, 'bad', {
      capacity: 10,
      refillPerSecond: 1,
      maxCost: 11,
      homeRegion: 'mars',
      minShare: 0.6,
      colour: 'red',
    });
    expect(r.statusCode).toBe(400);
    expect(r.headers['content-type']).toBe('application/problem+json; charset=utf-8');
    const body = r.json<{ code: string; type: string; errors: { path: string; message: string }[] }>();
    expect(body.code).toBe('COORD_ERR_VALIDATION');
    expect(body.type).toBe('urn:quotaplane:problem:coord-err-validation');
    expect(body.errors.map((e) => e.path).sort()).toEqual([
      'body',
      'body.homeRegion',
      'body.maxCost',
      'body.minShare',
      'body.minShare',
    ]);
    expect(body.errors.map((e) => e.message)).toEqual(
      expect.arrayContaining([
        'Unrecognized key: "colour"',
        'homeRegion must be one of the configured regions (us, eu)',
        'minShare × 2 regions must be ≤ 1, or the floors alone exceed the budget',
      ]),
    );
    const strictNoHome = await put(f, 'strict', { capacity: 10, refillPerSecond: 1, mode: 'strict' });
    expect(strictNoHome.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual([
      'body.homeRegion',
    ]);
    const strictHome = await put(f, 'strict', {
      capacity: 10,
      refillPerSecond: 1,
      mode: 'strict',
      homeRegion: 'eu',
    });
    expect(strictHome.statusCode).toBe(201);
    const badName = await put(f, 'Bad..Name', { capacity: 10, refillPerSecond: 1 });
    expect(badName.statusCode).toBe(400);
    expect(badName.json<{ errors: { path: string }[] }>().errors.map((e) => e.path)).toEqual(['params.name']);
  });

  it('refuses quantities too small to count: capacity and maxCost below 0.001, refill below 1e-6, fractional slots', async () => {
    await using f = await coordinatorFixture();
    const before = await state(f);
    const problems = async (reply: ReturnType<typeof put>) => {
      const r = await reply;
      expect(r.statusCode).toBe(400);
      const body = r.json<{ code: string; errors: { path: string; message: string }[] }>();
      expect(body.code).toBe('COORD_ERR_VALIDATION');
      return body.errors.map((e) => `${e.path}: ${e.message}`).sort();
    };
    // 1e-7 is less than one micro-token, the unit every store counts in: it could never admit anything.
    expect(await problems(put(f, 'tiny', { capacity: 1e-7, refillPerSecond: 1 }))).toEqual([
      'body.capacity: capacity must be ≥ 0.001',
    ]);
    expect(await problems(put(f, 'cheap', { capacity: 10, refillPerSecond: 1, maxCost: 1e-7 }))).toEqual([
      'body.maxCost: maxCost must be ≥ 0.001',
    ]);
    expect(await problems(put(f, 'slow', { capacity: 0.001, refillPerSecond: 1e-7 }))).toEqual([
      'body.refillPerSecond: refillPerSecond must be ≥ 0.000001',
    ]);
    expect(
      await problems(
        put(f, 'classy', {
          capacity: 10,
          refillPerSecond: 1,
          classes: { gold: { capacity: 0.0005, refillPerSecond: 1, maxCost: 0.0005 } },
        }),
      ),
    ).toEqual([
      'body.classes.gold.capacity: capacity must be ≥ 0.001',
      'body.classes.gold.maxCost: maxCost must be ≥ 0.001',
    ]);
    expect(await problems(put(f, 'slots', { kind: 'concurrency', capacity: 2.5, leaseSeconds: 10 }))).toEqual(
      ['body.capacity: a concurrency policy counts whole slots: capacity must be an integer ≤ 100000'],
    );
    // The smallest that may be written is written; a budget change below it is a 400 too.
    expect((await put(f, 'least', { capacity: 0.001, refillPerSecond: 1e-6 })).statusCode).toBe(201);
    const written = await state(f);
    expect(await problems(patch(f, 'least', { capacity: 1e-7 }))).toEqual([
      'body.capacity: capacity must be ≥ 0.001',
    ]);
    expect(await problems(patch(f, 'least', { refillPerSecond: 0 }))).toEqual([
      'body.refillPerSecond: refillPerSecond must be ≥ 0.000001',
    ]);
    expect(await state(f)).toEqual(written);
    expect(written.keys).toEqual([...before.keys, policyKey('least')].sort());
  });

  it('changes nothing on any bad request', async () => {
    await using f = await coordinatorFixture({ bodyLimitBytes: 512 });
    await put(f, 'keep', { capacity: 10, refillPerSecond: 1 });
    const before = await state(f);
    const bad = [
      put(f, 'keep', { capacity: -1, refillPerSecond: 1 }),
      put(f, 'keep', { capacity: 10 }),
      put(f, 'new', { capacity: 10, refillPerSecond: 1, name: 'new' }),
      f.app.inject({
        method: 'PUT',
        url: '/v1/policies/keep',
        headers: { ...admin, ...json },
        payload: '{"capacity":',
      }),
      f.app.inject({ method: 'PUT', url: '/v1/policies/keep', headers: { ...admin, ...json }, payload: '' }),
      f.app.inject({
        method: 'PUT',
        url: '/v1/policies/keep',
        headers: { ...admin, 'content-type': 'text/plain' },
        payload: 'capacity=1',
      }),
      f.app.inject({
        method: 'PUT',
        url: '/v1/policies/keep',
        headers: { ...admin, ...json },
        payload: JSON.stringify({ capacity: 10, refillPerSecond: 1, pad: 'x'.repeat(600) }),
      }),
      f.app.inject({
        method: 'PUT',
        url: '/v1/policies/keep',
        headers: { ...admin, ...json },
        payload: '{"capacity":10,"refillPerSecond":1,"__proto__":{"x":1}}',
      }),
      patch(f, 'keep', {}),
      patch(f, 'keep', { capacity: 'ten' }),
      patch(f, 'keep', { capacity: 10, maxCost: 2 }),
      patch(f, 'missing', { capacity: 10 }),
      put(
        f,
        'keep',
        { capacity: 99, refillPerSecond: 1 },
        { authorization: 'Bearer wrong-token-0000000000' },
      ),
      put(f, 'keep', { capacity: 99, refillPerSecond: 1 }, reader),
      f.app.inject({ method: 'DELETE', url: '/v1/policies/keep', headers: reader }),
      f.app.inject({ method: 'DELETE', url: '/v1/policies/keep' }),
    ];
    const statuses = [];
    for (const r of bad) statuses.push((await r).statusCode);
    expect(statuses).toEqual([
      400, 400, 400, 400, 400, 415, 413, 400, 400, 400, 400, 404, 401, 403, 403, 401,
    ]);
    expect(await state(f)).toEqual(before);
    expect((await f.app.inject({ url: '/v1/policies/keep', headers: reader })).json()).toMatchObject({
      capacity: 10,
    });
  });

  it('refuses the policy after the configured maximum with 409 and creates nothing', async () => {
    await using f = await coordinatorFixture({ maxPolicies: 2 });
    expect((await put(f, 'a', { capacity: 1, refillPerSecond: 1 })).statusCode).toBe(201);
    expect((await put(f, 'b', { capacity: 1, refillPerSecond: 1 })).statusCode).toBe(201);
    const third = await put(f, 'c', { capacity: 1, refillPerSecond: 1 });
    expect(third.statusCode).toBe(409);
    expect(third.json()).toMatchObject({ code: 'COORD_ERR_POLICY_LIMIT' });
    // Replacing an existing one is still allowed at the cap, and a delete makes room.
    expect((await put(f, 'a', { capacity: 2, refillPerSecond: 1 })).statusCode).toBe(200);
    await f.app.inject({ method: 'DELETE', url: '/v1/policies/b', headers: admin });
    expect((await put(f, 'c', { capacity: 1, refillPerSecond: 1 })).statusCode).toBe(201);
    expect((await state(f)).keys).toEqual(['a', 'c']);
  });

  it('keeps the cap exact under concurrent creates', async () => {
    await using f = await coordinatorFixture({ maxPolicies: 5 });
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) => put(f, `p${i}`, { capacity: 1, refillPerSecond: 1 })),
    );
    const codes = results.map((r) => r.statusCode);
    expect(codes.filter((c) => c === 201)).toHaveLength(5);
    expect(codes.filter((c) => c === 409)).toHaveLength(7);
    expect((await state(f)).keys).toHaveLength(5);
  });

  it('emits one change event per write, in order, for the protocol engine', async () => {
    await using f = await coordinatorFixture();
    const changes: PolicyChange[] = [];
    const off = f.stores.policies.onChange((c) => changes.push(c));
    await put(f, 'p', { capacity: 10, refillPerSecond: 1 });
    await put(f, 'p', { capacity: 10, refillPerSecond: 2 });
    await patch(f, 'p', { capacity: 30 });
    await f.app.inject({ method: 'DELETE', url: '/v1/policies/p', headers: admin });
    off();
    await put(f, 'q', { capacity: 1, refillPerSecond: 1 });
    expect(
      changes.map((c) => [c.kind, c.name, c.revision, c.before?.capacity ?? null, c.after?.capacity ?? null]),
    ).toEqual([
      ['create', 'p', 1, null, 10],
      ['replace', 'p', 2, 10, 10],
      ['budget', 'p', 3, 10, 30],
      ['delete', 'p', 4, 30, null],
    ]);
  });

  it('an old ETag loses to a writer that slips in behind its back, and the guard puts its own policy back', async () => {
    await using f = await coordinatorFixture();
    await put(f, 'p', { capacity: 10, refillPerSecond: 1 });
    // Another process writes behind this coordinator's back; an If-Match with the old ETag must lose.
    await f.stores.kv.put(policyKey('p'), JSON.stringify({ name: 'p', capacity: 50, refillPerSecond: 1 }));
    const r = await patch(f, 'p', { capacity: 20 }, { 'if-match': '"1"' });
    expect(r.statusCode).toBe(412);
    await eventually(
      async () =>
        (await f.app.inject({ url: '/v1/policies/p', headers: reader })).json<{ capacity: number }>()
          .capacity === 10,
      5000,
      'the coordinator restores its own policy',
    );
    expect(f.stores.guard.found).toBe(1);
  });

  it('leaves no consumer on the server after listing, counting or reading the audit trail (the guard watches with one)', async () => {
    await using f = await coordinatorFixture({ maxPolicies: 3 });
    const { jetstreamManager } = await import('@nats-io/jetstream');
    const jsm = await jetstreamManager(f.nc);
    for (const n of ['a', 'b', 'c', 'd']) await put(f, n, { capacity: 1, refillPerSecond: 1 });
    for (let i = 0; i < 5; i++) {
      expect((await f.app.inject({ url: '/v1/policies', headers: reader })).statusCode).toBe(200);
      expect((await f.app.inject({ url: '/v1/audit?policy=a', headers: reader })).statusCode).toBe(200);
    }
    const consumers = async (stream: string) => (await jsm.streams.info(stream)).state.consumer_count;
    expect(await consumers(`KV_${f.stores.names.policies}`)).toBe(1);
    expect(await consumers(f.stores.names.auditStream)).toBe(0);
  });
});
