import { agentOnRedis } from '../../helpers/agent-fixture.js';
import calculateSlot from 'cluster-key-slot';
import type { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { AgentClient } from '../../../packages/client/src/index.js';
import { DecisionResponse, LeaseReleaseResponse } from '../../../core/wire/agent.js';
import { bucketKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import {
  logArguments,
  logRefundArguments,
  parseLogRefundReply,
  parseLogReply,
  slidingLogKey,
  SlidingLogModel,
  type LogRefund,
} from '../../../core/models/sliding-log.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { connectRedis, whenReady } from '../../../regional-agent/redis/connect.js';
import { luaSource } from '../../../regional-agent/redis/scripts.js';
import {
  checkAcquire,
  concurrencyCases,
  prepareConcurrencyCase,
  rememberLease,
} from '../../cases/concurrency-cases.js';
import { LOG_CASE_EPOCH_MICROS } from '../../cases/sliding-log-cases.js';
import { sharedRedis, uniquePrefix } from '../../harness/fixtures.js';
import { withClockArg } from '../../helpers/lua-test-build.js';
import { eventually } from '../../helpers/coordinator-fixture.js';

const policies = [
  parsePolicy({ name: 'exports', kind: 'concurrency', capacity: 100, leaseSeconds: 600 }),
  parsePolicy({ name: 'short', kind: 'concurrency', capacity: 2, leaseSeconds: 1 }),
  parsePolicy({ name: 'jobs', kind: 'concurrency', capacity: 4, leaseSeconds: 600, maxCost: 2 }),
  parsePolicy({ name: 'rate', capacity: 1, refillPerSecond: 1e-4 }),
];

function agentOn(redis: Redis | Cluster, region = 'us'): AgentApp {
  return agentOnRedis(redis, policies, { region });
}

async function decide(agent: AgentApp, body: object) {
  const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
  expect(res.statusCode, res.body).toBe(200);
  return DecisionResponse.parse(res.json());
}

async function release(agent: AgentApp, lease: string) {
  // As a client that sends Content-Type: application/json on every request does, with no body.
  const res = await agent.app.inject({
    method: 'DELETE',
    url: `/v1/leases/${encodeURIComponent(lease)}`,
    headers: { 'content-type': 'application/json' },
  });
  return { status: res.statusCode, body: res.json<Record<string, unknown>>() };
}

const redis = sharedRedis();
redis.defineCommand('qpSlidingLogAt', { lua: withClockArg('sliding_log') });
const at = (n: number, ...args: string[]) =>
  (redis as unknown as { qpSlidingLogAt(n: number, ...a: string[]): Promise<unknown> }).qpSlidingLogAt(
    n,
    ...args,
  );
let agent: AgentApp;

beforeAll(async () => {
  agent = agentOn(redis);
  await agent.ready;
});
afterAll(async () => {
  await agent.app.close();
});

describe('concurrency leases: lua/sliding_log.lua and its refund agree exactly with the model', () => {
  for (const c of concurrencyCases) {
    it(c.name, async () => {
      const model = new SlidingLogModel();
      const prefix = uniquePrefix('conc');
      const fromRedis = new Map<string, LogRefund>();
      const fromModel = new Map<string, LogRefund>();
      const problems: string[] = [];
      let i = 0;
      for (const s of prepareConcurrencyCase(prefix, c)) {
        if ('release' in s) {
          const now = LOG_CASE_EPOCH_MICROS + Math.round(s.step.at * 1000);
          const { keys, argv } = logRefundArguments(s.release(fromRedis));
          const got = parseLogRefundReply(
            await redis.eval(luaSource('sliding_log_refund'), keys.length, ...keys, ...argv),
            1,
          );
          expect(got, `release ${i}`).toEqual(model.refund(s.release(fromModel), now));
          if (s.step.expect !== undefined && got.removed[0] !== s.step.expect.removed)
            problems.push(`step ${i}: removed want ${s.step.expect.removed} got ${got.removed[0]}`);
        } else {
          const { keys, argv } = logArguments(s.request);
          const reply = parseLogReply(await at(keys.length, ...keys, ...argv, String(s.nowMicros)), 1);
          const modelReply = model.evaluate(s.request, s.nowMicros);
          expect(reply, `acquire ${i} (at ${s.step.at} ms)`).toEqual(modelReply);
          rememberLease(fromRedis, s.step, s.request, reply);
          rememberLease(fromModel, s.step, s.request, modelReply);
          for (const p of checkAcquire(s.step, reply)) problems.push(`step ${i}: ${p}`);
        }
        i++;
      }
      expect(problems).toEqual([]);
    });
  }
});

describe('concurrency policies through the agent on a real Redis', () => {
  it('500 racing callers on 100 slots: exactly 100 acquire, each with a lease; releasing them frees exactly 100', async () => {
    const subject = uniquePrefix('race');
    const race = () =>
      Promise.all(Array.from({ length: 500 }, () => decide(agent, { policy: 'exports', subject })));
    const first = await race();
    const held = first.filter((d) => d.allowed);
    expect(held).toHaveLength(100);
    expect(first.filter((d) => !d.allowed).every((d) => d.results[0]!.lease === undefined)).toBe(true);
    const leases = held.map((d) => d.results[0]!.lease!);
    expect(new Set(leases).size).toBe(100);
    expect(await redis.zcount(slidingLogKey(1, subject, 'exports'), '(-inf', '+inf')).toBe(100);

    const released = await Promise.all(leases.map((l) => release(agent, l)));
    expect(released.every((r) => r.status === 200)).toBe(true);
    expect(released.map((r) => LeaseReleaseResponse.parse(r.body).slots)).toEqual(Array(100).fill(1));
    // Every entry gone; the key keeps only its high-water mark (lua/sliding_log.lua) until it expires.
    expect(await redis.zcount(slidingLogKey(1, subject, 'exports'), '(-inf', '+inf')).toBe(0);
    expect(await redis.zcard(slidingLogKey(1, subject, 'exports'))).toBe(1);
    // A second release of the same lease changes nothing.
    expect((await release(agent, leases[0]!)).body).toEqual({ policy: 'exports', released: false, slots: 0 });

    const second = await race();
    expect(second.filter((d) => d.allowed)).toHaveLength(100);
  });

  it("a crashed holder's slots come back when its lease runs out", async () => {
    const subject = uniquePrefix('crash');
    expect((await decide(agent, { policy: 'short', subject })).allowed).toBe(true);
    const taken = Date.now();
    expect((await decide(agent, { policy: 'short', subject })).allowed).toBe(true);
    const full = await decide(agent, { policy: 'short', subject });
    expect(full.allowed).toBe(false);
    expect(full.results[0]!.reason).toBe('subject_exhausted');
    expect(full.results[0]!.retryAfterMs).toBeGreaterThan(0);
    expect(full.results[0]!.retryAfterMs).toBeLessThanOrEqual(1000);
    // Nobody releases: a slot is free again once the first lease (1 s) has run out, never before.
    await eventually(
      async () => (await decide(agent, { policy: 'short', subject })).allowed,
      5000,
      'a slot back after the lease',
    );
    expect(Date.now() - taken).toBeGreaterThanOrEqual(900);
  });

  it('a lease of several slots is released whole; bad tokens and other regions are refused and change nothing', async () => {
    const subject = uniquePrefix('multi');
    const two = await decide(agent, { policy: 'jobs', subject, cost: 2 });
    const lease = two.results[0]!.lease!;
    expect(two.results[0]!.remaining).toBe(2);
    expect((await release(agent, 'l1.bm90LWEtbGVhc2U')).body).toMatchObject({
      status: 400,
      code: 'AGT_ERR_INVALID_LEASE',
    });
    const other = agentOn(redis, 'eu');
    await other.ready;
    expect((await release(other, lease)).body).toMatchObject({
      status: 421,
      code: 'AGT_ERR_WRONG_REGION',
    });
    await other.app.close();
    expect(await redis.zcount(slidingLogKey(1, subject, 'jobs'), '(-inf', '+inf')).toBe(2);
    expect((await release(agent, lease)).body).toEqual({ policy: 'jobs', released: true, slots: 2 });
    expect(await redis.zcount(slidingLogKey(1, subject, 'jobs'), '(-inf', '+inf')).toBe(0);
    const metrics = await agent.metrics.registry.getSingleMetricAsString('quotaplane_lease_releases_total');
    expect(metrics).toMatch(/policy="jobs",outcome="released"} 1/);
  });

  it('forged, raised, retargeted, truncated and replayed releases are refused and change nothing', async () => {
    const holder = uniquePrefix('holder');
    const bystander = uniquePrefix('bystander');
    const lease = (await decide(agent, { policy: 'jobs', subject: holder, cost: 2 })).results[0]!.lease!;
    expect((await decide(agent, { policy: 'jobs', subject: bystander })).allowed).toBe(true);
    const [body = '', tag = ''] = lease.slice(3).split('.');
    const fields = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as unknown[];
    const reencode = (change: (f: unknown[]) => void) => {
      const f = [...fields];
      change(f);
      return `l2.${Buffer.from(JSON.stringify(f)).toString('base64url')}.${tag}`;
    };
    const forged = [
      // The count raised to what hung Redis when tokens were readable base64 (lua/sliding_log_refund.lua looped).
      reencode((f) => (f[6] = 9e15)),
      reencode((f) => (f[6] = 3)),
      // Pointed at another holder's log.
      reencode((f) => (f[3] = bystander)),
      lease.slice(0, -1),
      lease.slice(0, lease.indexOf('.', 3)),
      `l1.${body}`,
    ];
    for (const token of forged) {
      expect((await release(agent, token)).body, token).toMatchObject({
        status: 400,
        code: 'AGT_ERR_INVALID_LEASE',
      });
    }
    expect(await redis.zcount(slidingLogKey(1, holder, 'jobs'), '(-inf', '+inf')).toBe(2);
    expect(await redis.zcount(slidingLogKey(1, bystander, 'jobs'), '(-inf', '+inf')).toBe(1);
    expect((await release(agent, lease)).body).toEqual({ policy: 'jobs', released: true, slots: 2 });
    // Replayed: the entries are gone, and nothing else is taken.
    expect((await release(agent, lease)).body).toEqual({ policy: 'jobs', released: false, slots: 0 });
    expect(await redis.zcount(slidingLogKey(1, bystander, 'jobs'), '(-inf', '+inf')).toBe(1);
  });

  it('lua/sliding_log_refund.lua and lua/sliding_log.lua refuse counts beyond MAX_LOG_LIMIT before any loop', async () => {
    const key = slidingLogKey(1, uniquePrefix('bound'), 'jobs');
    await redis.zadd(key, 1, '1:000000000');
    const refund = (cost: number) =>
      (redis as unknown as { qpLogRefundRaw(n: number, ...a: string[]): Promise<unknown> }).qpLogRefundRaw(
        1,
        key,
        '1',
        '0',
        '1',
        '0',
        String(cost),
      );
    redis.defineCommand('qpLogRefundRaw', { lua: luaSource('sliding_log_refund') });
    await expect(refund(9e15)).rejects.toThrow(/QP_BADARG cost of log 1 must be an integer in 1\.\.100000/);
    await expect(refund(100_001)).rejects.toThrow(/QP_BADARG cost/);
    expect(await redis.zcard(key)).toBe(1);
    await expect(at(1, key, '1', '0', '0', '0', '1000000', '1000', '1', '1000', '1')).rejects.toThrow(
      /QP_BADARG limit of log 1/,
    );
    await expect(
      at(1, key, '1', '0', '0', '0', '10', '1000', '9000000000000000', '1000', '1'),
    ).rejects.toThrow(/QP_BADARG cost of log 1/);
    expect(await refund(100_000)).toEqual([1, 0]);
  });

  it('the longest subject makes a token the release route takes (no 414 from the path length)', async () => {
    const subject = `${uniquePrefix('long')}-`.padEnd(96, 'x');
    const d = await decide(agent, { policy: 'jobs', subject });
    const lease = d.results[0]!.lease!;
    expect(lease.length).toBeGreaterThan(100);
    expect(await release(agent, lease)).toEqual({
      status: 200,
      body: { policy: 'jobs', released: true, slots: 1 },
    });
  });

  it('layered with a rate in one decision: a denial by the rate acquires no slot', async () => {
    const subject = uniquePrefix('layer');
    const body = {
      checks: [
        { policy: 'jobs', subject },
        { policy: 'rate', subject },
      ],
    };
    const ok = await decide(agent, body);
    expect(ok.allowed).toBe(true);
    expect(ok.results[0]!.lease).toBeDefined();
    const denied = await decide(agent, body);
    expect(denied.allowed).toBe(false);
    expect(denied.results[0]!.lease).toBeUndefined();
    expect(await redis.zcount(slidingLogKey(1, subject, 'jobs'), '(-inf', '+inf')).toBe(1);
  });
});

describe('concurrency on a real 3-master Redis Cluster', () => {
  let cluster: Cluster;
  let clusterAgent: AgentApp;
  beforeAll(async () => {
    const nodes = inject('redisCluster').map((n) => `${n.host}:${n.port}`);
    cluster = connectRedis({ redisClusterNodes: nodes }) as Cluster;
    cluster.on('error', () => undefined);
    await whenReady(cluster, 10_000);
    clusterAgent = agentOn(cluster);
    await clusterAgent.ready;
  });
  afterAll(async () => {
    await clusterAgent.app.close();
    cluster.disconnect();
  });

  it('slot and rate in different cluster slots: the rate denying gives the slot back', async () => {
    const job = uniquePrefix('job');
    let tenant = uniquePrefix('tenant');
    while (calculateSlot(slidingLogKey(1, job, 'jobs')) === calculateSlot(bucketKey(1, tenant, 'rate'))) {
      tenant = uniquePrefix('tenant');
    }
    const body = {
      checks: [
        { policy: 'jobs', subject: job },
        { policy: 'rate', subject: tenant },
      ],
    };
    expect((await decide(clusterAgent, body)).allowed).toBe(true);
    const denied = await decide(clusterAgent, body);
    expect(denied.allowed).toBe(false);
    expect(denied.results[0]!.lease).toBeUndefined();
    expect(await cluster.zcount(slidingLogKey(1, job, 'jobs'), '(-inf', '+inf')).toBe(1);
  });

  it('500 racing callers through the agent acquire exactly the slots', async () => {
    const subject = uniquePrefix('crace');
    const all = await Promise.all(
      Array.from({ length: 500 }, () => decide(clusterAgent, { policy: 'exports', subject })),
    );
    expect(all.filter((d) => d.allowed)).toHaveLength(100);
    expect(await cluster.zcount(slidingLogKey(1, subject, 'exports'), '(-inf', '+inf')).toBe(100);
  });
});

describe('@quotaplane/client releases leases', () => {
  it('acquire through decide, release through releaseLease; a bad token is an AgentRequestError', async () => {
    const listening = agentOn(redis);
    await listening.ready;
    const address = await listening.app.listen({ host: '127.0.0.1', port: 0 });
    const client = new AgentClient({ baseUrl: address, timeoutMs: 2000 });
    try {
      const subject = uniquePrefix('sdk');
      const d = await client.decide({ policy: 'short', subject });
      expect(d.allowed).toBe(true);
      const lease = d.results[0]!.lease!;
      expect(await client.releaseLease(lease)).toEqual({ policy: 'short', released: true, slots: 1 });
      expect(await client.releaseLease(lease)).toEqual({ policy: 'short', released: false, slots: 0 });
      await expect(client.releaseLease('nope')).rejects.toMatchObject({
        name: 'AgentRequestError',
        code: 'AGT_ERR_INVALID_LEASE',
      });
    } finally {
      await listening.app.close();
    }
  });
});
