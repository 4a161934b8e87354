/**
 * The hostile-input suite, agent side (issue 25, Deliver 3): generated table-driven cases over every entry point a
 * caller reaches on an agent — POST /v1/decisions, every forward-auth flavour, the gRPC rate-limit service,
 * reservations (create, commit, cancel), lease releases and explain — on a Redis of this file's own. The hostile
 * values: prototype names, NaN, infinities, negatives, 2^53 and beyond, forged and truncated tokens, oversized
 * bodies, another region's tokens. For each case:
 * - the answer is a 4xx problem with the stable code the table names (gRPC: its own status and that code), never a
 *   5xx and never the failure mode (a policy failing open included);
 * - nothing changes: every key of the Redis is read back (SCAN + DUMP) and equals what it was;
 * - a bystander tenant's next decision is exactly what it would have been;
 * and over the whole file: no Redis command ran longer than SLOW_MICROS (SLOWLOG read back on the real Redis),
 * the event loop never stalled (STALL_MS), and the agent counted each refusal under its code
 * (quotaplane_request_errors_total). Where a hostile name is a legitimate value (a subject called `constructor`),
 * the case is a decision of that subject's own bucket, and only that bucket changes.
 * The NATS side and the coordinator's admin API are in hostile-input-coordinator.test.ts.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { InjectOptions } from 'fastify';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { RlsError } from '../../../regional-agent/grpc/rls-service.js';
import type { RedisServer } from '../../harness/backend.js';
import { uniquePrefix } from '../../harness/fixtures.js';
import { redisSnapshot } from '../../helpers/redis-snapshot.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

/** Longest a Redis command may run in this file, µs (SLOWLOG threshold): "a few milliseconds". */
const SLOW_MICROS = 20_000;
/** Longest the event loop may be held, ms: a hostile loop in the agent would hold it for good. */
const STALL_MS = 2000;

const policies = [
  // Fails open: a caller's mistake must never reach the failure mode and be admitted free.
  parsePolicy({
    name: 'open',
    capacity: 10,
    refillPerSecond: 0.001,
    maxCost: 5,
    onStoreFailure: 'open',
    classes: { gold: { capacity: 20, refillPerSecond: 0.002, maxCost: 5 } },
    subjects: { vip: 'gold' },
  }),
  parsePolicy({ name: 'slots', kind: 'concurrency', capacity: 4, leaseSeconds: 600, maxCost: 2 }),
  parsePolicy({ name: 'log', kind: 'sliding_log', capacity: 5, windowSeconds: 600, maxCost: 2 }),
  parsePolicy({ name: 'day', kind: 'daily', capacity: 100, maxCost: 5 }),
  parsePolicy({ name: 'bystander', capacity: 100_000, refillPerSecond: 0.1 }),
];
const KINDS = ['open', 'slots', 'log', 'day'] as const;

const PROTOTYPE_NAMES = [
  'constructor',
  '__proto__',
  'toString',
  'hasOwnProperty',
  'valueOf',
  'prototype',
  '__defineGetter__',
];
/** Numbers as raw JSON text (so NaN and 1e400 reach the parser as sent), and what is not a number at all. */
const HOSTILE_NUMBERS = [
  'NaN',
  'Infinity',
  '-Infinity',
  '1e400',
  '-1e400',
  '-1',
  '0',
  '-0',
  '1e-7',
  '9007199254740992',
  '9007199254740993',
  '1e16',
  '1e308',
  '"1"',
  'null',
  'true',
  '[]',
  '{}',
];
/** Hostile numbers a JSON parser turns into a value (the rest are malformed JSON). */
const PARSED_NUMBERS = HOSTILE_NUMBERS.filter((t) => !/^-?(NaN|Infinity)$/.test(t));

let fixture: AgentFixture;
let server: RedisServer;
let redis: Redis;
let agent: AgentApp;
const run = uniquePrefix('hostile');
const subject = `${run}-s`;
const bystander = `${run}-bystander`;
let bystanderRemaining = 100_000;
const loop = monitorEventLoopDelay({ resolution: 10 });
/** Refusals by code, as the cases expect them: the agent's counter must say the same. */
const expectedCodes = new Map<string, number>();

interface Answer {
  status: number;
  code: unknown;
  body: string;
}

async function send(request: InjectOptions): Promise<Answer> {
  const r = await agent.app.inject(request);
  let code: unknown;
  try {
    code = r.json<{ code?: unknown }>().code;
  } catch {
    code = r.headers['x-quota-code'];
  }
  return { status: r.statusCode, code: code ?? r.headers['x-quota-code'], body: r.body };
}

async function bystanderDecides(): Promise<void> {
  const r = await agent.app.inject({
    method: 'POST',
    url: '/v1/decisions',
    payload: { policy: 'bystander', subject: bystander },
  });
  expect(r.statusCode).toBe(200);
  bystanderRemaining--;
  expect(r.json()).toMatchObject({ allowed: true, results: [{ remaining: bystanderRemaining }] });
}

/**
 * One refused case: a 4xx with `code` (and `status` when given), nothing in Redis changed, the bystander decided
 * as before. `counted` false for refusals the agent answers before its error counter (404 of an unknown route).
 */
async function refused(
  name: string,
  request: InjectOptions,
  code: string | RegExp,
  status?: number,
  counted = true,
): Promise<void> {
  const before = await redisSnapshot(redis);
  const a = await send(request);
  expect(a.status, `${name}: ${a.body}`).toBeGreaterThanOrEqual(400);
  expect(a.status, `${name}: ${a.body}`).toBeLessThan(500);
  if (status !== undefined) expect(a.status, name).toBe(status);
  expect(String(a.code), `${name}: ${a.body}`).toMatch(
    typeof code === 'string' ? new RegExp(`^${code}$`) : code,
  );
  expect(await redisSnapshot(redis), name).toBe(before);
  if (counted) expectedCodes.set(String(a.code), (expectedCodes.get(String(a.code)) ?? 0) + 1);
  await bystanderDecides();
}

const decisions = (payload: string): InjectOptions => ({
  method: 'POST',
  url: '/v1/decisions',
  headers: { 'content-type': 'application/json' },
  payload,
});

beforeAll(async () => {
  fixture = await agentFixture({
    policies,
    redis: 'own',
    config: {
      trustedProxies: ['127.0.0.1'],
      breakerVolumeThreshold: 1,
      leaseTokenSecret: 'the lease key of region us, 32ch',
    },
  });
  ({ agent, server } = fixture as AgentFixture & { server: RedisServer });
  redis = fixture.redis as Redis;
  await redis.config('SET', 'slowlog-log-slower-than', String(SLOW_MICROS));
  await redis.slowlog('RESET');
  loop.enable();
});

afterAll(async () => {
  loop.disable();
  await fixture?.[Symbol.asyncDispose]();
});

describe('hostile input at every agent entry point: a 4xx with a stable code, and nothing changes', () => {
  it('POST /v1/decisions: hostile costs, classes, policies, subjects, keys and shapes on every kind', async () => {
    for (const policy of KINDS) {
      const check = (extra: string) => `{"policy":"${policy}","subject":"${subject}"${extra}}`;
      for (const n of HOSTILE_NUMBERS) {
        const malformed = !PARSED_NUMBERS.includes(n) || n === '1e400' || n === '-1e400';
        // JSON.parse reads 1e400 as Infinity; the body parser refuses what JSON does not allow.
        const code = /^-?(NaN|Infinity)$/.test(n)
          ? 'AGT_ERR_MALFORMED_JSON'
          : malformed
            ? /AGT_ERR_(INVALID_COST|INVALID_REQUEST|MALFORMED_JSON)/
            : /AGT_ERR_(INVALID_COST|INVALID_REQUEST|COST_ABOVE_MAX)/;
        await refused(`${policy} cost ${n}`, decisions(check(`,"cost":${n}`)), code);
        await refused(
          `${policy} layered cost ${n}`,
          decisions(`{"checks":[${check(`,"cost":${n}`)},{"policy":"bystander","subject":"${subject}"}]}`),
          code,
        );
      }
      // Whole numbers above maxCost, and a fraction on the whole-unit kinds.
      await refused(`${policy} cost above maxCost`, decisions(check(',"cost":6')), 'AGT_ERR_COST_ABOVE_MAX');
      // Token buckets and daily budgets count micro-units; the logs count whole entries.
      if (policy === 'slots' || policy === 'log') {
        await refused(`${policy} fractional cost`, decisions(check(',"cost":1.5')), 'AGT_ERR_INVALID_COST');
      }
      for (const name of PROTOTYPE_NAMES) {
        await refused(
          `${policy} class ${name}`,
          decisions(check(`,"class":"${name}"`)),
          /AGT_ERR_(UNKNOWN_CLASS|INVALID_REQUEST)/,
        );
      }
    }
    for (const name of [...PROTOTYPE_NAMES, 'Open', 'open ', 'x'.repeat(65)]) {
      await refused(
        `policy ${name}`,
        decisions(`{"policy":${JSON.stringify(name)},"subject":"${subject}"}`),
        /AGT_ERR_(UNKNOWN_POLICY|INVALID_REQUEST)/,
      );
    }
    // Text the agent cannot key is the subject's problem; anything but text is a malformed request.
    for (const bad of [
      '""',
      '"\\u0000"',
      JSON.stringify('x'.repeat(1025)),
      JSON.stringify('x'.repeat(5000)),
    ]) {
      await refused(
        `subject ${bad.slice(0, 20)}`,
        decisions(`{"policy":"open","subject":${bad}}`),
        'AGT_ERR_INVALID_SUBJECT',
      );
      await refused(
        `layered subject ${bad.slice(0, 20)}`,
        decisions(
          `{"checks":[{"policy":"bystander","subject":"${subject}"},{"policy":"open","subject":${bad}}]}`,
        ),
        'AGT_ERR_INVALID_SUBJECT',
      );
    }
    for (const bad of ['1', 'null', '{}', '["a"]']) {
      await refused(
        `subject ${bad}`,
        decisions(`{"policy":"open","subject":${bad}}`),
        'AGT_ERR_INVALID_REQUEST',
      );
    }
    const shapes: [string, string][] = [
      ['a __proto__ key', `{"__proto__":{"policy":"open"},"subject":"${subject}"}`],
      ['a constructor key', `{"policy":"open","subject":"${subject}","constructor":{"prototype":{}}}`],
      ['dryRun as text', `{"policy":"open","subject":"${subject}","dryRun":"yes"}`],
      ['an empty key', `{"policy":"open","subject":"${subject}","idempotencyKey":""}`],
      ['a long key', `{"policy":"open","subject":"${subject}","idempotencyKey":"${'k'.repeat(600)}"}`],
      ['no checks', '{"checks":[]}'],
      [
        '17 checks',
        `{"checks":[${Array.from({ length: 17 }, (_, i) => `{"policy":"open","subject":"s${i}"}`).join(',')}]}`,
      ],
      [
        'a duplicate check',
        `{"checks":[{"policy":"open","subject":"${subject}"},{"policy":"open","subject":"${subject}"}]}`,
      ],
      ['a number', '42'],
      ['an array', '[]'],
      ['nothing', ''],
      ['broken JSON', '{"policy":'],
      ['deep nesting', `${'['.repeat(5000)}${']'.repeat(5000)}`],
    ];
    for (const [name, payload] of shapes) {
      await refused(name, decisions(payload), /^AGT_ERR_[A-Z_]+$/);
    }
    await refused(
      'a body above the limit',
      decisions(`{"policy":"open","subject":"${subject}","pad":"${'x'.repeat(2 * 1024 * 1024)}"}`),
      'AGT_ERR_BODY_TOO_LARGE',
      413,
    );
    await refused(
      'a text body',
      { method: 'POST', url: '/v1/decisions', headers: { 'content-type': 'text/plain' }, payload: 'open' },
      'AGT_ERR_UNSUPPORTED_MEDIA_TYPE',
      415,
    );
  }, 60_000);

  it('an unknown class on a policy that fails open is refused every time, never admitted free', async () => {
    const key = bucketKey(1, `${run}-free`, 'open');
    for (let i = 0; i < 30; i++) {
      await refused(
        `class constructor #${i}`,
        decisions(`{"policy":"open","subject":"${run}-free","class":"constructor"}`),
        'AGT_ERR_UNKNOWN_CLASS',
        400,
      );
    }
    expect(await redis.exists(key)).toBe(0);
  });

  it('prototype names are ordinary subjects: each decides its own bucket, nobody else is charged', async () => {
    for (const name of PROTOTYPE_NAMES) {
      for (let i = 1; i <= 11; i++) {
        const r = await send(decisions(`{"policy":"open","subject":"${name}"}`));
        expect(r.status, r.body).toBe(200);
        expect(JSON.parse(r.body), `${name} #${i}`).toMatchObject({
          allowed: i <= 10,
          results: [{ remaining: Math.max(0, 10 - i) }],
        });
      }
      await bystanderDecides();
    }
  });

  it('forward-auth, every flavour: hostile policies, costs and subjects', async () => {
    const routes = [
      '/v1/forward-auth',
      '/v1/forward-auth/nginx',
      '/v1/forward-auth/traefik',
      '/v1/forward-auth/envoy/x',
    ];
    for (const url of routes) {
      const envoy = url.includes('envoy');
      const ask = (policy: string, cost: string | undefined, who: string | undefined): InjectOptions => {
        const headers: Record<string, string> = {};
        if (who !== undefined) headers['x-quota-subject'] = who;
        if (envoy) {
          headers['x-quota-policy'] = policy;
          if (cost !== undefined) headers['x-quota-cost'] = cost;
        }
        return {
          method: 'GET',
          url,
          headers,
          ...(envoy ? {} : { query: { policy, ...(cost === undefined ? {} : { cost }) } }),
          remoteAddress: '127.0.0.1',
        };
      };
      for (const name of PROTOTYPE_NAMES) {
        await refused(`${url} policy ${name}`, ask(name, undefined, subject), 'AGT_ERR_UNKNOWN_POLICY');
      }
      for (const cost of [
        'NaN',
        'Infinity',
        '-Infinity',
        '-1',
        '0',
        '-0',
        '1e400',
        '9007199254740993',
        '1e-7',
        '0x10',
        '6',
        'one',
      ]) {
        await refused(
          `${url} cost ${cost}`,
          ask('open', cost, subject),
          /AGT_ERR_(INVALID_QUERY|INVALID_COST|COST_ABOVE_MAX)/,
        );
      }
      await refused(
        `${url} no subject`,
        ask('open', undefined, undefined),
        /AGT_ERR_(MISSING|INVALID)_SUBJECT/,
      );
      await refused(
        `${url} untrusted peer`,
        { ...ask('open', undefined, subject), remoteAddress: '10.9.9.9' },
        'AGT_ERR_UNTRUSTED_PROXY',
      );
    }
  }, 60_000);

  it('the gRPC rate-limit service: hostile hits, names and shapes are gRPC errors in its own terms', async () => {
    const request = (
      hits: unknown,
      entries: { key: string; value: string }[] = [{ key: 'policy', value: 'open' }],
    ) => ({
      domain: 'quotaplane',
      descriptors: [{ entries: [...entries, { key: 'subject', value: subject }] }],
      ...(hits === undefined ? {} : { hits_addend: hits }),
    });
    const cases: [string, unknown, string][] = [
      ...[NaN, Infinity, -Infinity, -1, 2 ** 53, 2 ** 53 + 2, 1e308, 1.5, '1', null, {}, []].map(
        (hits): [string, unknown, string] => [
          `hits ${JSON.stringify(hits) ?? 'undefined'} (${typeof hits})`,
          request(hits),
          'INVALID_ARGUMENT',
        ],
      ),
      ['hits above maxCost', request(6), 'INVALID_ARGUMENT'],
      ...PROTOTYPE_NAMES.map((name): [string, unknown, string] => [
        `policy ${name}`,
        request(undefined, [{ key: 'policy', value: name }]),
        'NOT_FOUND',
      ]),
      ['no descriptors', { domain: 'quotaplane', descriptors: 'x' }, 'INVALID_ARGUMENT'],
      ['a __proto__ request', JSON.parse('{"__proto__":{"domain":"quotaplane"}}'), 'INVALID_ARGUMENT'],
      ['nothing', undefined, 'INVALID_ARGUMENT'],
    ];
    for (const [name, raw, status] of cases) {
      const before = await redisSnapshot(redis);
      const answer = await agent.rls.shouldRateLimit(raw, 2000).then(
        () => 'decided',
        (error: unknown) => error,
      );
      expect(answer, name).toBeInstanceOf(RlsError);
      expect((answer as RlsError).status, `${name}: ${(answer as Error).message}`).toBe(status);
      expect(await redisSnapshot(redis), name).toBe(before);
      const code = (answer as RlsError).code;
      if (code !== undefined) expectedCodes.set(code, (expectedCodes.get(code) ?? 0) + 1);
      await bystanderDecides();
    }
  });

  it('reservations: hostile amounts, names and forged ids', async () => {
    const reserve = (payload: string): InjectOptions => ({
      method: 'POST',
      url: '/v1/reservations',
      headers: { 'content-type': 'application/json' },
      payload,
    });
    for (const policy of KINDS) {
      for (const n of HOSTILE_NUMBERS) {
        await refused(
          `reserve ${policy} amount ${n}`,
          reserve(`{"policy":"${policy}","subject":"${subject}","amount":${n}}`),
          /AGT_ERR_(INVALID_RESERVATION|INVALID_REQUEST|INVALID_COST|COST_ABOVE_MAX|MALFORMED_JSON)/,
        );
      }
    }
    for (const name of PROTOTYPE_NAMES) {
      await refused(
        `reserve policy ${name}`,
        reserve(`{"policy":"${name}","subject":"${subject}","amount":1}`),
        'AGT_ERR_UNKNOWN_POLICY',
      );
    }
    for (const ttl of ['0', '-1', '1e400', '3601', '1.5', '9007199254740993']) {
      await refused(
        `reserve ttl ${ttl}`,
        reserve(`{"policy":"open","subject":"${subject}","amount":1,"ttlSeconds":${ttl}}`),
        /AGT_ERR_(INVALID_RESERVATION|INVALID_REQUEST|MALFORMED_JSON)/,
      );
    }
    // A real reservation, then hostile settlements of it and of ids nobody issued.
    const real = await send(reserve(`{"policy":"open","subject":"${run}-held","amount":2}`));
    expect(real.status, real.body).toBe(200);
    const id = (JSON.parse(real.body) as { reservation: { id: string } }).reservation.id;
    // 0 (and -0, and a fraction) are amounts a commit may settle; every other one is refused.
    for (const n of HOSTILE_NUMBERS.filter((t) => !['0', '-0', '1e-7'].includes(t))) {
      await refused(
        `commit amount ${n}`,
        {
          method: 'POST',
          url: `/v1/reservations/${id}/commit`,
          headers: { 'content-type': 'application/json' },
          payload: `{"amount":${n}}`,
        },
        /AGT_ERR_(INVALID_RESERVATION|COMMIT_ABOVE_RESERVED|MALFORMED_JSON|INVALID_REQUEST)/,
      );
    }
    const forged = [
      ...PROTOTYPE_NAMES,
      id.slice(0, -1),
      `${id}x`,
      id.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A')),
      'r1.AAAAAAAAAAAAAAAAAAAAAA',
      'x'.repeat(64),
    ];
    for (const other of forged) {
      await refused(
        `commit ${other}`,
        {
          method: 'POST',
          url: `/v1/reservations/${encodeURIComponent(other)}/commit`,
          headers: { 'content-type': 'application/json' },
          payload: '{"amount":1}',
        },
        /AGT_ERR_(UNKNOWN_RESERVATION|INVALID_RESERVATION|INVALID_REQUEST|WRONG_REGION)/,
      );
      await refused(
        `cancel ${other}`,
        { method: 'DELETE', url: `/v1/reservations/${encodeURIComponent(other)}` },
        /AGT_ERR_(UNKNOWN_RESERVATION|INVALID_RESERVATION|INVALID_REQUEST|WRONG_REGION)/,
      );
    }
    await refused(
      'cancel an id above the path limit',
      { method: 'DELETE', url: `/v1/reservations/${'x'.repeat(65)}` },
      /AGT_ERR_(INVALID_RESERVATION|INVALID_REQUEST)/,
    );
  }, 60_000);

  it('lease releases: forged, raised, truncated, other-region and replayed tokens', async () => {
    const held = await send(decisions(`{"policy":"slots","subject":"${run}-lease","cost":2}`));
    expect(held.status, held.body).toBe(200);
    const lease = (JSON.parse(held.body) as { results: { lease: string }[] }).results[0]!.lease;
    const [body = '', tag = ''] = lease.slice(3).split('.');
    const fields = JSON.parse(Buffer.from(body, 'base64url').toString()) as unknown[];
    const reencode = (at: number, value: unknown, region?: string) => {
      const f = [...fields];
      f[at] = value;
      if (region !== undefined) f[0] = region;
      return `l2.${Buffer.from(JSON.stringify(f)).toString('base64url')}.${tag}`;
    };
    const release = (token: string): InjectOptions => ({
      method: 'DELETE',
      url: `/v1/leases/${encodeURIComponent(token)}`,
    });
    const forged = [
      ...[9e15, 2 ** 53, 3, 0, -1, 1.5, null, 'NaN'].map((cost) => reencode(6, cost)),
      reencode(3, `${run}-other`),
      reencode(1, 'constructor'),
      reencode(4, 2 ** 60),
      lease.slice(0, -1),
      lease.slice(0, lease.lastIndexOf('.')),
      `${lease}A`,
      `l1.${body}`,
      ...PROTOTYPE_NAMES,
    ];
    for (const token of forged) {
      await refused(`release ${token.slice(0, 40)}`, release(token), 'AGT_ERR_INVALID_LEASE', 400);
    }
    await refused(
      'a token above the path limit',
      release(`l2.${'A'.repeat(600)}`),
      'AGT_ERR_URI_TOO_LONG',
      414,
    );
    await refused('a bad escape', release('%zz'), 'AGT_ERR_INVALID_LEASE', 400);
    // Another region's token (its key is not ours): misdirected.
    await refused('another region', release(reencode(6, 2, 'eu')), 'AGT_ERR_WRONG_REGION', 421);
    // The real one releases exactly its two slots, once.
    expect(await send(release(lease))).toMatchObject({ status: 200 });
    const again = await send(release(lease));
    expect(JSON.parse(again.body)).toEqual({ policy: 'slots', released: false, slots: 0 });
  });

  it('explain: hostile policies, subjects and costs', async () => {
    const explain = (query: Record<string, string>): InjectOptions => ({
      method: 'GET',
      url: '/v1/explain',
      query,
    });
    for (const name of PROTOTYPE_NAMES) {
      await refused(`explain policy ${name}`, explain({ policy: name, subject }), 'AGT_ERR_UNKNOWN_POLICY');
    }
    // Hex, binary and blank costs too: a query number is decimal text (`z.coerce.number` read 0x10 as 16, "" as 0).
    for (const cost of [
      'NaN',
      'Infinity',
      '-1',
      '0',
      '1e400',
      '9007199254740993',
      'x',
      '0x10',
      '0b1',
      '',
      ' 2',
    ]) {
      await refused(
        `explain cost ${cost}`,
        explain({ policy: 'open', subject, cost }),
        /AGT_ERR_(INVALID_QUERY|INVALID_REQUEST|INVALID_COST|COST_ABOVE_MAX)/,
      );
    }
    await refused(
      'explain no subject',
      explain({ policy: 'open' }),
      /AGT_ERR_(INVALID_QUERY|INVALID_REQUEST|MISSING_SUBJECT)/,
    );
  });

  it("with Redis frozen, a caller's mistake is still its 4xx, never the failure mode (open or closed)", async () => {
    await server.pause();
    const answers: { status: number; code: unknown }[] = [];
    try {
      for (const payload of [
        `{"policy":"open","subject":"${run}-frozen","class":"constructor"}`,
        `{"policy":"open","subject":"${run}-frozen","cost":6}`,
        `{"policy":"open","subject":"${run}-frozen","cost":-1}`,
        `{"policy":"constructor","subject":"${run}-frozen"}`,
        `{"policy":"open","subject":""}`,
      ]) {
        const a = await send(decisions(payload));
        answers.push({ status: a.status, code: a.code });
        expectedCodes.set(String(a.code), (expectedCodes.get(String(a.code)) ?? 0) + 1);
      }
    } finally {
      await server.resume();
    }
    expect(answers).toEqual([
      { status: 400, code: 'AGT_ERR_UNKNOWN_CLASS' },
      { status: 400, code: 'AGT_ERR_COST_ABOVE_MAX' },
      { status: 400, code: 'AGT_ERR_INVALID_COST' },
      { status: 404, code: 'AGT_ERR_UNKNOWN_POLICY' },
      { status: 400, code: 'AGT_ERR_INVALID_SUBJECT' },
    ]);
    expect(await redis.exists(bucketKey(1, `${run}-frozen`, 'open'))).toBe(0);
    expect(agent.guard.state).toBe('closed');
  });

  it('over the whole file: every refusal counted under its code, no slow Redis command, no stalled event loop', async () => {
    const text = (await agent.app.inject({ method: 'GET', url: '/metrics' })).body;
    for (const [code, count] of expectedCodes) {
      const match = new RegExp(`quotaplane_request_errors_total\\{[^}]*code="${code}"[^}]*\\} (\\d+)`).exec(
        text,
      );
      expect(Number(match?.[1] ?? 0), code).toBe(count);
    }
    // Scripts only: a command the machine merely descheduled is not what a hostile argument can cause.
    const slow = ((await redis.slowlog('GET', 100)) as unknown[][]).filter((e) =>
      /^(EVAL|EVALSHA|FCALL)/i.test(String((e[3] as unknown[] | undefined)?.[0])),
    );
    expect(slow, JSON.stringify(slow)).toEqual([]);
    expect(loop.max / 1e6, `event loop held ${loop.max / 1e6} ms`).toBeLessThan(STALL_MS);
    expect(agent.guard.state).toBe('closed');
  });
});
