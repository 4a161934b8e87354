/**
 * The hostile-input suite, coordinator and NATS side (issue 25, Deliver 3; the agent's HTTP and gRPC entry points
 * are in hostile-input.test.ts): generated table-driven cases over the coordinator's admin API, and over the NATS
 * messages an agent (strict checks, loan asks) or the coordinator (heartbeats, usage, acks, goodbyes) receives,
 * sent with another region's real agent credentials on a locked-down NATS. Hostile values: prototype names, NaN,
 * infinities, negatives, 2^53 and beyond, oversized bodies, wrong and unknown regions. For each case:
 * - admin API: a 4xx problem with a stable COORD_ERR_ code, no policy changed, no audit record written;
 * - NATS: an error answer with a stable wire code (never `failed` or `overloaded`: the caller's mistake is not
 *   the store's), or no answer for a fire-and-forget message; every region's Redis read back unchanged;
 * - a bystander tenant's next decision exactly what it would have been;
 * and over the file: no Redis command slower than SLOW_MICROS in any region (SLOWLOG read back), no stalled loop.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LoanErrorCode, loanSubject } from '../../../core/wire/loan.js';
import { protocolSubjects } from '../../../core/wire/protocol.js';
import { ForwardErrorCode, strictSubject } from '../../../core/wire/strict.js';
import {
  admin,
  coordinatorFixture,
  reader,
  type CoordinatorFixture,
} from '../../helpers/coordinator-fixture.js';
import { decide, startStack, STRICT_REFUNDS, type ServiceStack } from '../../helpers/fixture/index.js';
import { redisSnapshot } from '../../helpers/redis-snapshot.js';

const SLOW_MICROS = 20_000;
const STALL_MS = 2000;

const PROTOTYPE_NAMES = ['constructor', '__proto__', 'toString', 'hasOwnProperty', 'valueOf', 'prototype'];
/** Numbers as raw JSON text, and what is not a number at all. */
const HOSTILE_NUMBERS = [
  'NaN',
  'Infinity',
  '-Infinity',
  '1e400',
  '-1',
  '0',
  '-0',
  '1e-7',
  '9007199254740992',
  '9007199254740993',
  '1e308',
  '"1"',
  'null',
  'true',
  '[]',
  '{}',
];

const loop = monitorEventLoopDelay({ resolution: 10 });
beforeAll(() => loop.enable());
afterAll(() => {
  loop.disable();
  expect(loop.max / 1e6, `event loop held ${loop.max / 1e6} ms`).toBeLessThan(STALL_MS);
});

describe('hostile input on the admin API: a 4xx with a stable code, no policy changed, nothing audited', () => {
  let f: CoordinatorFixture;
  beforeAll(async () => {
    f = await coordinatorFixture();
    const seeded = await f.app.inject({
      method: 'PUT',
      url: '/v1/policies/exports',
      headers: { ...admin, 'content-type': 'application/json' },
      payload: JSON.stringify({
        capacity: 10,
        refillPerSecond: 1,
        classes: { gold: { capacity: 20, refillPerSecond: 2 } },
      }),
    });
    expect(seeded.statusCode, seeded.body).toBe(201);
  });
  afterAll(async () => {
    await f?.close();
  });

  const listing = async () => (await f.app.inject({ url: '/v1/policies', headers: reader })).body;
  const audited = async () =>
    (await f.app.inject({ url: '/v1/audit?limit=1000', headers: reader })).json<{ entries: unknown[] }>()
      .entries.length;

  async function refused(
    name: string,
    method: 'PUT' | 'PATCH' | 'DELETE' | 'GET',
    url: string,
    payload?: string,
  ) {
    const before = await listing();
    const trail = await audited();
    const r = await f.app.inject({
      method,
      url,
      headers: { ...admin, ...(payload === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(payload === undefined ? {} : { payload }),
    });
    expect(r.statusCode, `${name}: ${r.body}`).toBeGreaterThanOrEqual(400);
    expect(r.statusCode, `${name}: ${r.body}`).toBeLessThan(500);
    expect(r.headers['content-type'], name).toMatch(/^application\/problem\+json/);
    expect(r.json<{ code: string }>().code, name).toMatch(/^COORD_ERR_[A-Z_]+$/);
    expect(await listing(), name).toBe(before);
    expect(await audited(), name).toBe(trail);
  }

  it('hostile numbers in every numeric field, prototype names in every name, wrong regions, oversized bodies', async () => {
    for (const field of ['capacity', 'refillPerSecond', 'maxCost', 'idleTtlSeconds', 'version', 'minShare']) {
      for (const n of HOSTILE_NUMBERS) {
        // Shares lie in [0, 1]. 1e-7 is below the least capacity, refill and maxCost an operator may write.
        if (field === 'minShare' && ['0', '-0', '1e-7'].includes(n)) continue;
        const body = `{"capacity":10,"refillPerSecond":1,"${field}":${n}}`.replace(
          new RegExp(`"${field}":[^,]*,(.*"${field}")`),
          '$1',
        );
        await refused(`${field} ${n}`, 'PUT', '/v1/policies/exports', body);
      }
    }
    for (const n of HOSTILE_NUMBERS) {
      await refused(
        `class capacity ${n}`,
        'PUT',
        '/v1/policies/exports',
        `{"capacity":10,"refillPerSecond":1,"classes":{"gold":{"capacity":${n}}}}`,
      );
      await refused(`budget ${n}`, 'PATCH', '/v1/policies/exports/budget', `{"capacity":${n}}`);
    }
    for (const name of ['__proto__', '__defineGetter__', 'Constructor', '..', '%00', 'x'.repeat(65)]) {
      await refused(
        `policy name ${name}`,
        'PUT',
        `/v1/policies/${encodeURIComponent(name)}`,
        '{"capacity":10,"refillPerSecond":1}',
      );
      await refused(
        `class name ${name}`,
        'PUT',
        '/v1/policies/exports',
        `{"capacity":10,"refillPerSecond":1,"classes":{${JSON.stringify(name)}:{"capacity":20}}}`,
      );
    }
    for (const name of PROTOTYPE_NAMES) {
      await refused(
        `subject of undefined class ${name}`,
        'PUT',
        '/v1/policies/exports',
        `{"capacity":10,"refillPerSecond":1,"classes":{"gold":{"capacity":20,"refillPerSecond":2}},"subjects":{"vip":${JSON.stringify(name)}}}`,
      );
      await refused(`delete ${name}`, 'DELETE', `/v1/policies/${name}`);
    }
    for (const region of ['mars', 'constructor', '__proto__', 'US', '']) {
      await refused(
        `home region ${region}`,
        'PUT',
        '/v1/policies/exports',
        `{"capacity":10,"refillPerSecond":1,"mode":"strict","homeRegion":${JSON.stringify(region)}}`,
      );
    }
    await refused(
      'a __proto__ body',
      'PUT',
      '/v1/policies/exports',
      '{"__proto__":{"capacity":10},"refillPerSecond":1}',
    );
    await refused('broken JSON', 'PUT', '/v1/policies/exports', '{"capacity":');
    await refused(
      'a body above the limit',
      'PUT',
      '/v1/policies/exports',
      `{"capacity":10,"refillPerSecond":1,"pad":"${'x'.repeat(2 * 1024 * 1024)}"}`,
    );
    await refused('audit limit NaN', 'GET', '/v1/audit?limit=NaN');
    await refused('audit limit 2^53', 'GET', '/v1/audit?limit=9007199254740993');
    await refused('audit limit in hex', 'GET', '/v1/audit?limit=0x10');
    await refused('audit limit twice', 'GET', '/v1/audit?limit=1&limit=2');
    // The policy list has no paging: a parameter is refused, never silently ignored.
    await refused('policies paged', 'GET', '/v1/policies?limit=-1&offset=abc');
    await refused('policies limit', 'GET', '/v1/policies?limit=10');
  }, 30_000);
});

describe('hostile NATS messages, sent with another region’s real agent credentials', () => {
  let stack: ServiceStack;
  let attacker: NatsConnection;
  let redis: Map<string, Redis>;
  const victim = { policy: 'ledger', subject: 'victim-tenant' };
  let victimRemaining: number;

  const snapshot = async (): Promise<string> =>
    JSON.stringify(await Promise.all([...redis.values()].map((r) => redisSnapshot(r))));
  const victimDecides = async (): Promise<void> => {
    const r = await decide(stack.inRegion('us')[0]!.url, victim);
    expect(r.status).toBe(200);
    victimRemaining--;
    expect(r.body).toMatchObject({ allowed: true, results: [{ remaining: victimRemaining }] });
  };

  beforeAll(async () => {
    stack = await startStack({
      regions: ['us', 'eu'],
      agentsPerRegion: 1,
      secure: { tls: false },
      rebalance: { roundMs: 60_000 },
      lease: { graceMs: 65_000 },
    });
    await stack.putPolicy('demo', {
      capacity: 90,
      refillPerSecond: 0.001,
      idleTtlSeconds: 1_000_000,
      classes: { gold: { capacity: 180, refillPerSecond: 0.002 } },
    });
    await stack.putPolicy('refunds', STRICT_REFUNDS);
    await stack.putPolicy('ledger', { ...STRICT_REFUNDS, capacity: 2400, idleTtlSeconds: 2_500_000 });
    await stack.ready(['demo', 'refunds', 'ledger']);
    redis = new Map([...stack.redis].map(([region, server]) => [region, new Redis(server.url)]));
    for (const r of redis.values()) {
      await r.config('SET', 'slowlog-log-slower-than', String(SLOW_MICROS));
      await r.slowlog('RESET');
    }
    attacker = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-eu-1'),
      maxReconnectAttempts: 0,
    });
    const first = await decide(stack.inRegion('us')[0]!.url, victim);
    victimRemaining = (first.body as unknown as { results: { remaining: number }[] }).results[0]!.remaining;
  }, 60_000);

  afterAll(async () => {
    await attacker?.close();
    for (const r of redis?.values() ?? []) r.disconnect();
    await stack?.[Symbol.asyncDispose]();
  });

  /** Ask `subject` with a raw body: the answer's error code (or 'no answer'); every Redis read back unchanged. */
  async function ask(name: string, subject: string, body: string, allowed: readonly string[]): Promise<void> {
    const before = await snapshot();
    const reply = await attacker.request(subject, body, { timeout: 5000 }).then(
      (m) => m.json<Record<string, unknown>>(),
      () => ({ error: 'no answer' }),
    );
    expect(reply, `${name}: ${JSON.stringify(reply)}`).toHaveProperty('error');
    expect(allowed, `${name}: ${JSON.stringify(reply)}`).toContain(reply['error']);
    expect(await snapshot(), name).toBe(before);
    await victimDecides();
  }

  it('strict checks forwarded to us: hostile costs, names, classes, budgets and regions', async () => {
    const to = strictSubject(stack.namespace, 'us').subject;
    const stable = ForwardErrorCode.options.filter((c) => c !== 'failed' && c !== 'overloaded');
    const forwarded = (over: string, check = '"policy":"refunds","subject":"hx","cost":1') =>
      `{"fromRegion":"eu","checks":[{${check}}],"dryRun":false,"budgetMs":2000${over}}`;
    for (const n of HOSTILE_NUMBERS) {
      await ask(
        `strict cost ${n}`,
        to,
        forwarded('', `"policy":"refunds","subject":"hx","cost":${n}`),
        stable,
      );
      await ask(
        `strict budget ${n}`,
        to,
        forwarded('').replace('"budgetMs":2000', `"budgetMs":${n}`),
        stable,
      );
    }
    for (const name of PROTOTYPE_NAMES) {
      await ask(
        `strict policy ${name}`,
        to,
        forwarded('', `"policy":"${name}","subject":"hx","cost":1`),
        stable,
      );
      await ask(
        `strict class ${name}`,
        to,
        forwarded('', `"policy":"refunds","subject":"hx","cost":1,"class":"${name}"`),
        stable,
      );
    }
    // A policy that is not homed in us, and regions that are not the sender's or are not regions at all.
    await ask('strict not home', to, forwarded('', '"policy":"demo","subject":"hx","cost":1'), stable);
    // The home itself, and names that are not region names. A well-formed name of no region ('mars') is decided as
    // the sender's own traffic (its credentials may forward; binding them to a region is issue 25's item 5), and
    // counted under the metric label `other`.
    for (const region of ['us', '__proto__', '', 'US', 'x'.repeat(65)]) {
      await ask(`strict from ${region}`, to, forwarded('').replace('"eu"', JSON.stringify(region)), stable);
    }
    await ask('strict a __proto__ body', to, '{"__proto__":{"fromRegion":"eu"}}', stable);
    await ask('strict broken JSON', to, '{"fromRegion":', stable);
  }, 60_000);

  it('loan asks to us: hostile amounts, versions, classes, names and regions', async () => {
    const to = loanSubject(stack.namespace, 'us').subject;
    const stable = LoanErrorCode.options.filter((c) => c !== 'failed' && c !== 'overloaded');
    const asked = (field: string, value: string) => {
      const base: Record<string, string> = {
        fromRegion: '"eu"',
        policy: '"demo"',
        version: '1',
        subject: '"hx"',
        mode: '"fill"',
        amountMicros: '1000',
        budgetMs: '2000',
        deadlineAtMs: String(Date.now() + 5000),
      };
      base[field] = value;
      return `{${Object.entries(base)
        .map(([k, v]) => `"${k}":${v}`)
        .join(',')}}`;
    };
    for (const n of HOSTILE_NUMBERS.filter((t) => !['1e-7', '0', '-0'].includes(t))) {
      for (const field of ['amountMicros', 'version', 'budgetMs']) {
        await ask(`loan ${field} ${n}`, to, asked(field, n), stable);
      }
    }
    for (const name of PROTOTYPE_NAMES) {
      await ask(`loan policy ${name}`, to, asked('policy', `"${name}"`), stable);
      await ask(`loan class ${name}`, to, asked('class', `"${name}"`), stable);
      await ask(`loan mode ${name}`, to, asked('mode', `"${name}"`), stable);
    }
    // Names that are no region at all, and well-formed ones no allocation record names ('mars', 'constructor').
    for (const region of ['__proto__', '', 'US', 'x'.repeat(65), 'mars', 'constructor']) {
      await ask(`loan from ${region}`, to, asked('fromRegion', JSON.stringify(region)), stable);
    }
    await ask('loan an amount beyond 2^53 µ', to, asked('amountMicros', '9007199254740993'), stable);
  }, 60_000);

  it('heartbeats, usage, acks and goodbyes to the coordinator with hostile values change no decision', async () => {
    const subjects = protocolSubjects(stack.namespace);
    const eu = stack.inRegion('eu')[0]!.running.coordination!.holder.agentId;
    const messages: [string, string][] = [];
    for (const n of HOSTILE_NUMBERS) {
      messages.push([
        subjects.heartbeat('eu'),
        `{"agentId":"${eu}","instance":"x","region":"eu","seq":${n},"appliedRevision":${n},"ackRevision":${n},"mode":"valid","renewedSeq":${n},"shed":${n}}`,
      ]);
      messages.push([
        subjects.usage('eu'),
        `{"agentId":"${eu}","region":"eu","seq":${n},"intervalMs":${n},"chunk":0,"chunks":1,"policies":[{"policy":"demo","requested":${n},"admitted":${n},"denied":${n},"demand":${n},"constrained":[]}],"dropped":0}`,
      ]);
      messages.push([subjects.ack('eu'), `{"agentId":"${eu}","region":"eu","ackRevision":${n}}`]);
    }
    for (const name of PROTOTYPE_NAMES) {
      messages.push([
        subjects.usage('eu'),
        `{"agentId":"${eu}","region":"eu","seq":1,"intervalMs":1000,"chunk":0,"chunks":1,"policies":[{"policy":"${name}","requested":1,"admitted":1,"denied":0,"demand":1,"constrained":[]}],"dropped":0}`,
      ]);
      messages.push([subjects.bye('eu'), `{"agentId":"${name}","region":"eu"}`]);
    }
    // Another region's messages from eu's credentials: refused by the server's permissions, or ignored.
    messages.push([subjects.bye('us'), `{"agentId":"${eu}","region":"us"}`]);
    messages.push([subjects.heartbeat('eu'), `{"agentId":"${eu}","instance":"x","region":"us","seq":1}`]);
    for (const [subject, body] of messages) {
      const before = await snapshot();
      attacker.publish(subject, body);
      await attacker.flush().catch(() => undefined);
      await stack.coordinator.nc.flush();
      expect(await snapshot(), `${subject} ${body.slice(0, 80)}`).toBe(before);
      await victimDecides();
    }
    for (const a of stack.agents) expect(a.running.agent.guard.state).toBe('closed');
  }, 60_000);

  it('over the file: no Redis command slower than a few ms in any region', async () => {
    for (const [region, r] of redis) {
      const slow = ((await r.slowlog('GET', 100)) as unknown[][]).filter((e) =>
        /^(EVAL|EVALSHA|FCALL)/i.test(String((e[3] as unknown[] | undefined)?.[0])),
      );
      expect(slow, `${region}: ${JSON.stringify(slow)}`).toEqual([]);
    }
  });
});
