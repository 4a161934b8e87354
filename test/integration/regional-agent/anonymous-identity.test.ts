/**
 * Anonymous identity (`subjectKind: ip`) on a real Redis, through the agent's own routes: addresses are bucketed
 * by the policy's prefixes in POST /v1/decisions, forward-auth (X-Forwarded-For walked past trusted hops) and
 * Envoy's rate-limit service alike; a subject that is no address changes nothing; the subject-creation cap
 * bounds the distinct identities admitted per minute; and the layered login default of
 * docs/anonymous-identity.md admits exactly what each layer allows.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecisionResponse, Problem } from '../../../core/wire/agent.js';
import { bucketKey, shardKey } from '../../../core/keys.js';
import { parsePolicy, type Policy } from '../../../core/policy/policy.js';
import { creationKey } from '../../../core/models/subject-creation.js';
import type { AgentApp } from '../../../regional-agent/app.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';
import { docBlock } from '../../helpers/doc-blocks.js';
import { uniquePrefix } from '../../harness/fixtures.js';

const u = uniquePrefix('anon').toLowerCase();
// Refills so slow that no whole token comes back during the test: quotas are exact counts.
const SLOW = 1e-4;

const CAPPED = `${u}-capped`;
const NET = `${u}-net`;
const capped = parsePolicy({
  name: CAPPED,
  capacity: 3,
  refillPerSecond: SLOW,
  subjectKind: 'ip',
  newSubjects: { perMinute: 50, flood: 'deny' },
});
const net = parsePolicy({
  name: NET,
  capacity: 4,
  refillPerSecond: SLOW,
  subjectKind: 'ip',
  ipv4Prefix: 24,
  ipv6Prefix: 56,
  newSubjects: { perMinute: 50, flood: 'deny' },
});

/** The login policies exactly as docs/anonymous-identity.md PUTs them, renamed for this run, refills slowed. */
function documentedLoginPolicies(): Map<string, Policy> {
  const block = docBlock('anonymous-identity.md', 'login-policies');
  const out = new Map<string, Policy>();
  for (const [, name, body] of block.matchAll(/\/v1\/policies\/([a-z-]+) [^\n]*\n[^\n]*-d '([^']*)'/g)) {
    const spec = JSON.parse(body!) as Record<string, unknown>;
    // A whole token per 10^6 / capacity seconds: refilling from empty takes 11.6 days, within the 30 allowed.
    if (spec['refillPerSecond'] !== undefined) spec['refillPerSecond'] = (spec['capacity'] as number) / 1e6;
    out.set(name!, parsePolicy({ ...spec, name: `${u}-${name}` }));
  }
  return out;
}
const login = documentedLoginPolicies();
const ACCOUNT = `${u}-login-account`;
const PREFIX = `${u}-login-prefix`;
const CEILING = `${u}-login-ceiling`;

let fixture: AgentFixture;
let redis: Redis;
let agent: AgentApp;
let draws = 0;

beforeAll(async () => {
  const policies = [capped, net, ...login.values()];
  fixture = await agentFixture({
    policies,
    shares: Object.fromEntries(policies.map((p) => [p.name, 1])),
    // A decision draws twice: its shard (a sharded check), then whether to log it. Shards go round in turn.
    deps: { random: () => (Math.floor(draws++ / 2) % 8) / 8 + 0.01 },
    config: {
      decisionDeadlineMs: 5000,
      storeTimeoutMs: 5000,
      reservationSweepMs: 0,
      trustedProxies: ['127.0.0.1', '10.0.0.0/8'],
      rlsRules: {
        rules: [{ entries: [{ key: 'remote_address' }], policy: NET, subject: '{remote_address:ip}' }],
      },
    },
  });
  ({ agent } = fixture);
  redis = fixture.redis as Redis;
});
afterAll(async () => {
  await fixture[Symbol.asyncDispose]();
});

async function post(body: object) {
  return agent.app.inject({ method: 'POST', url: '/v1/decisions', payload: body });
}
async function decide(body: object): Promise<DecisionResponse> {
  const res = await post(body);
  expect(res.statusCode, res.body).toBe(200);
  return DecisionResponse.parse(res.json());
}
/** `n` decisions, at most `wave` in flight; `body(i)` builds the i-th. */
async function many(n: number, wave: number, body: (i: number) => object): Promise<DecisionResponse[]> {
  const out: DecisionResponse[] = [];
  for (let start = 0; start < n; start += wave) {
    const batch = Array.from({ length: Math.min(wave, n - start) }, (_, j) => decide(body(start + j)));
    out.push(...(await Promise.all(batch)));
  }
  return out;
}
async function scanCount(pattern: string): Promise<number> {
  let n = 0;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    n += keys.length;
  } while (cursor !== '0');
  return n;
}
const allowedCount = (rs: readonly DecisionResponse[]) => rs.filter((r) => r.allowed).length;

describe('ip subjects in POST /v1/decisions', () => {
  it('every form of one address, and every address of one prefix, is one subject', async () => {
    // The /24 of 192.0.2.x and the /56 of 2001:db8:5:a00::/56, in every accepted form.
    const v4 = ['192.0.2.1', 'ip:192.0.2.200', '::ffff:192.0.2.77', 'ip:192.0.2.0/24', '192.0.2.255'];
    const v6 = ['2001:db8:5:a00::1', '2001:DB8:5:AFF:FFFF::9', 'ip:2001:db8:5:a42::/64', 'fe80::1%eth0'];
    const a = [];
    for (const subject of v4) a.push(await decide({ policy: NET, subject }));
    expect(a.map((r) => r.allowed)).toEqual([true, true, true, true, false]);
    expect(a[4]!.results[0]!.reason).toBe('subject_exhausted');
    const b = [];
    for (const subject of v6.slice(0, 3)) b.push(await decide({ policy: NET, subject }));
    expect(b.map((r) => r.results[0]!.remaining)).toEqual([3, 2, 1]);
    expect(await redis.exists(bucketKey(1, 'ip:192.0.2.0/24', NET))).toBe(1);
    expect(await redis.exists(bucketKey(1, 'ip:2001:db8:5:a00::/56', NET))).toBe(1);
    // A link-local address with a zone id is its own /56, the zone dropped.
    expect((await decide({ policy: NET, subject: v6[3]! })).allowed).toBe(true);
    expect(await redis.exists(bucketKey(1, 'ip:fe80:0:0:0::/56', NET))).toBe(1);
  });

  it('a subject that is no address, or a wider network, is 400 AGT_ERR_INVALID_SUBJECT and charges nothing', async () => {
    for (const subject of ['user:42', '198.51.100', '127.1', 'ip:198.51.0.0/16']) {
      const res = await post({
        checks: [
          { policy: NET, subject: '198.51.100.9' },
          { policy: NET, subject },
        ],
      });
      expect(res.statusCode, subject).toBe(400);
      const problem = Problem.parse(res.json());
      expect(problem.code).toBe('AGT_ERR_INVALID_SUBJECT');
      expect(problem.detail).toContain(`checks.1: ${NET} counts clients by IP address`);
    }
    // The valid check of those requests was never charged, and nothing was created for the bad ones.
    expect(await scanCount(`rl:*{ip:198.51.*`)).toBe(0);
    expect(await redis.zcard(creationKey(NET))).toBe(3); // 192.0.2.0/24, 2001:db8:5:a00::/56, fe80::/56 above
  });
});

describe('the cap on distinct anonymous identities (newSubjects on an ip policy)', () => {
  it('cap 50 per minute: 600 distinct prefixes admit exactly 49 after one known client, the rest subject_flood', async () => {
    // The known client: one creation of the 50, then 2 tokens of 3 left.
    expect((await decide({ policy: CAPPED, subject: '2001:db8:4b1d:1::1' })).allowed).toBe(true);
    const address = (i: number) =>
      i % 2 === 0 ? `100.64.${i >> 8}.${i & 0xff}` : `2001:db8:f00d:${i.toString(16)}::1`;
    const known: DecisionResponse[] = [];
    const all = await many(600, 100, (i) => ({ policy: CAPPED, subject: address(i) }));
    // Meanwhile, the known client from another address of its /64: decided as before, never a flood answer.
    for (let i = 0; i < 3; i++)
      known.push(await decide({ policy: CAPPED, subject: `2001:db8:4b1d:1::${i + 2}` }));
    expect(allowedCount(all)).toBe(49);
    const flood = all.filter((r) => !r.allowed);
    expect(flood).toHaveLength(551);
    for (const r of flood) expect(r.results[0]!.reason).toBe('subject_flood');
    expect(known.map((r) => r.allowed)).toEqual([true, true, false]);
    expect(known[2]!.results[0]!.reason).toBe('subject_exhausted');
    expect(await scanCount(`rl:v1:{ip:*}:${CAPPED}`)).toBe(50);
    expect(await redis.zcard(creationKey(CAPPED))).toBe(50);
  });

  it('600 addresses of one /56, 100 at a time from first contact, are one identity: one creation, one key', async () => {
    const before = await redis.zcard(creationKey(NET));
    const address = (i: number) => `2001:db8:77:${(0x1200 + (i % 256)).toString(16)}:${i.toString(16)}::1`;
    // First contact is a wave of 100 concurrent requests: the racing first decisions of the new /56 share one
    // creation (docs/subject-creation-cap.md).
    const all = await many(600, 100, (i) => ({ policy: NET, subject: address(i) }));
    expect(allowedCount(all)).toBe(4);
    expect(all.filter((r) => r.results[0]!.reason === 'subject_flood')).toHaveLength(0);
    expect(await redis.zcard(creationKey(NET))).toBe(before + 1);
    expect(await scanCount(`rl:v1:{ip:2001:db8:77:*}:${NET}`)).toBe(1);
  });
});

describe('ip subjects from proxies', () => {
  const forwardAuth = (xff: string | undefined, headers: Record<string, string> = {}) =>
    agent.app.inject({
      method: 'GET',
      url: `/v1/forward-auth?policy=${NET}`,
      remoteAddress: '10.1.2.3',
      headers: xff === undefined ? headers : { ...headers, 'x-forwarded-for': xff },
    });

  it('forward-auth takes the client from X-Forwarded-For past trusted hops, by the policy’s prefixes', async () => {
    // 198.18.0.66 is what the client wrote; 10.9.9.9 is a trusted hop; 203.0.113.9 is the client.
    const statuses = [];
    for (const xff of [
      '198.18.0.66, 203.0.113.9, 10.9.9.9',
      '203.0.113.200',
      '198.18.0.66, 203.0.113.1',
      '203.0.113.77, 10.0.0.1',
      '203.0.113.5',
    ]) {
      // The subject header is ignored for an ip policy: the client address decides.
      statuses.push((await forwardAuth(xff, { 'x-quota-subject': `user:${statuses.length}` })).statusCode);
    }
    expect(statuses).toEqual([204, 204, 204, 204, 429]);
    expect(await redis.exists(bucketKey(1, 'ip:203.0.113.0/24', NET))).toBe(1);
    expect(await scanCount(`rl:*{ip:198.18.*`)).toBe(0);
    expect(await scanCount(`rl:*{user:*}:${NET}`)).toBe(0);
  });

  it('forward-auth refuses an X-Forwarded-For whose client entry is no address, charging nothing', async () => {
    const res = await forwardAuth('not-an-address, 10.0.0.1');
    expect(res.statusCode).toBe(400);
    expect(Problem.parse(res.json()).code).toBe('AGT_ERR_INVALID_SUBJECT');
    // Without X-Forwarded-For, the subject header must itself be an address of the ip policy.
    const header = await forwardAuth(undefined, { 'x-quota-subject': 'user:7' });
    expect(header.statusCode).toBe(400);
    expect(Problem.parse(header.json()).code).toBe('AGT_ERR_INVALID_SUBJECT');
  });

  it('Envoy’s {remote_address:ip} is bucketed by the prefixes of the policy the rule checks', async () => {
    const ask = (address: string) =>
      agent.rls.shouldRateLimit(
        { domain: 'edge', descriptors: [{ entries: [{ key: 'remote_address', value: address }] }] },
        5000,
      );
    const codes = [];
    for (const address of [
      '2001:db8:99:1f00::1',
      '2001:db8:99:1f01::1',
      '2001:db8:99:1fff:1::',
      '2001:db8:99:1f42::7',
      '2001:db8:99:1f00::2',
    ])
      codes.push((await ask(address)).overall_code);
    expect(codes).toEqual(['OK', 'OK', 'OK', 'OK', 'OVER_LIMIT']);
    expect(await redis.exists(bucketKey(1, 'ip:2001:db8:99:1f00::/56', NET))).toBe(1);
  });
});

describe('the layered login default of docs/anonymous-identity.md', () => {
  const attempt = (account: string, address: string) => ({
    checks: [
      { policy: ACCOUNT, subject: account },
      { policy: PREFIX, subject: address },
      { policy: CEILING, subject: 'all' },
    ],
  });
  // A refused request charges no check; the checks that did not fit wait (retryAfterMs > 0), the others do not.
  const refusedBy = (r: DecisionResponse) =>
    r.results.filter((x) => x.retryAfterMs !== 0).map((x) => x.policy);

  it('the documented policies are the three layers', () => {
    expect([...login.keys()]).toEqual(['login-account', 'login-prefix', 'login-ceiling']);
    expect(login.get('login-account')).toMatchObject({
      kind: 'sliding_log',
      capacity: 5,
      windowSeconds: 600,
    });
    expect(login.get('login-prefix')).toMatchObject({
      capacity: 20,
      subjectKind: 'ip',
      ipv6Prefix: 64,
      newSubjects: { perMinute: 1000, flood: 'shared' },
    });
    expect(login.get('login-ceiling')).toMatchObject({ capacity: 600, shards: 8 });
  });

  it('one account: exactly 5 of 7 attempts; the refused two charge the prefix and the ceiling nothing', async () => {
    const seven = [];
    for (let i = 0; i < 7; i++) seven.push(await decide(attempt('user:alice', '2001:db8:7:1::2a')));
    expect(seven.map((r) => r.allowed)).toEqual([true, true, true, true, true, false, false]);
    for (const r of seven.slice(5)) expect(refusedBy(r)).toEqual([ACCOUNT]);
  });

  it('one /64 spraying 30 accounts: exactly the prefix’s remaining 15 admitted', async () => {
    const spray = [];
    for (let i = 0; i < 30; i++)
      spray.push(await decide(attempt(`user:spray-${i}`, `2001:db8:7:1:${i.toString(16)}::1`)));
    expect(allowedCount(spray)).toBe(15);
    for (const r of spray.slice(15)) expect(refusedBy(r)).toEqual([PREFIX]);
  });

  it('700 prefixes on 700 accounts: exactly the ceiling’s remaining 580 admitted, every refusal by the ceiling', async () => {
    // One at a time, so each decision's two draws are consecutive and the shards go round evenly.
    const wide = await many(700, 1, (i) =>
      attempt(
        `user:wide-${i}`,
        i % 2 === 0 ? `2001:db8:c:${i.toString(16)}::1` : `100.65.${i >> 8}.${i & 0xff}`,
      ),
    );
    expect(allowedCount(wide)).toBe(580);
    for (const r of wide.filter((x) => !x.allowed)) expect(refusedBy(r)).toEqual([CEILING]);
    // All 8 shards took their part: 8 × 75 = 600 admitted in all (5 + 15 + 580).
    for (let k = 0; k < 8; k++)
      expect(await redis.exists(shardKey(1, 'all', CEILING, k)), `shard ${k}`).toBe(1);
  });
});
