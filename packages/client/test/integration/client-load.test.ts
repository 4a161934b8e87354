/**
 * The client under load, against a real agent process on a real Redis: a burst of 2,000 concurrent requests to
 * a Fastify service protected by the plugin with default options answers 200 or a truthful 429 (never
 * LIMITER_UNAVAILABLE), admitting exactly the bucket; coalesced decisions keep exact counts and layered checks
 * all-or-nothing; a full client queue sheds, told apart from an unavailable agent; a frozen (SIGSTOP) and a
 * stopped agent still fail each policy as declared, every request answered while the agent is down.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import Fastify, { type FastifyInstance } from 'fastify';
import { describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError, type Decision } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';
import { agentProcessOnOwnRedis } from '../../../../test/helpers/agent-process.js';
import { tcpProxy } from '../../../../test/helpers/tcp-proxy.js';
import { eventually } from '../../../../test/helpers/wait.js';

const BURST = 2000;

const own = agentProcessOnOwnRedis({
  // The agent's own store calls get generous timeouts: these tests count what the client does with its answers
  // on a shared machine; the client's own options stay its defaults.
  env: { QP_STORE_TIMEOUT_MS: '2000', QP_DECISION_DEADLINE_MS: '3000' },
  policies: {
    burst: { capacity: 500, refillPerSecond: 0.001, onStoreFailure: 'closed' },
    hundred: { capacity: 100, refillPerSecond: 0.001 },
    wide: { capacity: 1000, refillPerSecond: 0.01 },
    open: { capacity: 1000, refillPerSecond: 0.01, onStoreFailure: 'open' },
  },
});

/** A service as docs/agent.md shows it: default client options, the subject from a header. */
async function service(client: AgentClient): Promise<{ app: FastifyInstance; url: string }> {
  const app = Fastify();
  await app.register(quotaplane, {
    client,
    subject: (r) =>
      typeof r.headers['x-tenant'] === 'string' ? `tenant:${r.headers['x-tenant']}` : undefined,
  });
  app.get('/work', { config: { quota: { policy: 'burst' } } }, () => ({ done: true }));
  app.get('/open', { config: { quota: { policy: 'open', onUnavailable: 'open' } } }, () => ({ done: true }));
  const url = await app.listen({ host: '127.0.0.1', port: 0, backlog: 4096 });
  return { app, url };
}

interface Answer {
  status: number;
  code: string | undefined;
  reason: string | undefined;
  violated: string[] | undefined;
}

const run = promisify(execFile);

/** `n` concurrent requests from a process of their own (as a load generator would send them). */
async function burstFromOutside(url: string, tenant: string, n: number): Promise<Answer[]> {
  const script = `
    const answers = await Promise.all(Array.from({ length: ${n} }, async () => {
      const res = await fetch(${JSON.stringify(url)}, { headers: { 'x-tenant': ${JSON.stringify(tenant)} } });
      const body = await res.json();
      return { status: res.status, code: body.code, reason: body.reason, violated: body['violated-policies'] };
    }));
    process.stdout.write(JSON.stringify(answers));`;
  const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], {
    maxBuffer: 64 * 1024 * 1024,
  });
  return JSON.parse(stdout) as Answer[];
}

async function burst(url: string, tenant: string, n: number): Promise<Answer[]> {
  return Promise.all(
    Array.from({ length: n }, async () => {
      const res = await fetch(url, { headers: { 'x-tenant': tenant } });
      const body = (await res.json()) as {
        code?: string;
        reason?: string;
        'violated-policies'?: string[];
      };
      return {
        status: res.status,
        code: body.code,
        reason: body.reason,
        violated: body['violated-policies'],
      };
    }),
  );
}

function tally(answers: readonly Answer[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of answers) {
    const key = `${a.status}${a.code === undefined ? '' : ` ${a.code}`}`;
    out[key] = (out[key] ?? 0) + 1;
  }
  return out;
}

describe('a burst through the plugin with default options', () => {
  // Default options but the timeout: the agent must answer 2,000 decisions on a machine these tests share with
  // others, and this test counts what the client makes of answers, not how fast they come (the default 300 ms is
  // measured by hand and in the bench). That queueing never counts toward it is the next describe's test.
  it(
    `answers ${BURST} concurrent requests with 200 or a truthful 429, admitting exactly the bucket`,
    {
      timeout: 60_000,
    },
    async () => {
      const client = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 2000 });
      const { app, url } = await service(client);
      try {
        const answers = await burstFromOutside(`${url}/work`, uniquePrefix('burst'), BURST);
        // Every answer is a 200 or a 429 RATE_LIMITED. Never more than the bucket is admitted; fewer only by the
        // tokens a local grant still holds when the burst ends (the client's default grants: at most two grants
        // of a tenth of the bucket per hot subject, docs/agent.md "Local grants"); CI once saw 450.
        const counts = tally(answers);
        expect(Object.keys(counts).sort(), JSON.stringify(client.stats())).toEqual([
          '200',
          '429 RATE_LIMITED',
        ]);
        expect(counts['200']! + counts['429 RATE_LIMITED']!).toBe(BURST);
        expect(counts['200']).toBeLessThanOrEqual(500);
        expect(counts['200']).toBeGreaterThanOrEqual(500 - 2 * (500 / 10));
        for (const a of answers.filter((x) => x.status === 429)) {
          expect(a).toMatchObject({ reason: 'subject_exhausted', violated: ['burst'] });
        }
        const stats = client.stats();
        expect(stats.failures).toEqual({
          timeout: 0,
          connection: 0,
          overloaded: 0,
          bad_status: 0,
          bad_body: 0,
          breaker_open: 0,
          refused: 0,
        });
        expect(stats.shed).toBe(0);
        // Every request decided: by the agent, or in-process by a local grant (or the agent's denial repeated).
        const grants = client.grantStats();
        expect(stats.decided + (grants?.local ?? 0) + (grants?.denied ?? 0)).toBe(BURST);
        // Coalesced: far fewer exchanges than decisions.
        expect(stats.exchanges).toBeLessThan(BURST / 4);
      } finally {
        await app.close();
        client.close();
      }
    },
  );
});

describe('time in the queue is not agent time', () => {
  it('decisions queued far longer than the timeout are all decided, none counted as a failure', async () => {
    // Each exchange takes about 60 ms on the wire (30 ms each way); one at a time, the 40th waits ~2.4 s.
    const target = new URL(own.agent.url);
    await using proxy = await tcpProxy({ host: target.hostname, port: Number(target.port) }, { delayMs: 30 });
    const client = new AgentClient({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      timeoutMs: 1000,
      coalesce: false,
      maxSockets: 1,
    });
    const subject = uniquePrefix('queued');
    const decisions = await Promise.all(Array.from({ length: 40 }, () => client.check('wide', subject)));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(40);
    const stats = client.stats();
    expect(Object.values(stats.failures).reduce((a, b) => a + b, 0)).toBe(0);
    expect(stats.exchanges).toBe(40);
    client.close();
  });
});

describe('exchanges in flight', () => {
  /** Every decision queued so far has left or is waiting: the client's pump ran (it runs on setImmediate). */
  const turn = () => new Promise((resolve) => setImmediate(resolve));

  it('decisions wait for the exchange in flight and leave together when it returns', async () => {
    const target = new URL(own.agent.url);
    await using proxy = await tcpProxy(
      { host: target.hostname, port: Number(target.port) },
      { delayMs: 200 },
    );
    const client = new AgentClient({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      timeoutMs: 5000,
      coalesce: { slowMs: 1000 },
    });
    const subject = uniquePrefix('wait');
    const first = client.check('wide', subject);
    await turn();
    const rest = Array.from({ length: 5 }, () => client.check('wide', subject));
    await turn();
    expect(client.stats()).toMatchObject({ inFlight: 1, queued: 5 });
    const decisions = await Promise.all([first, ...rest]);
    expect(decisions.filter((d) => d.allowed)).toHaveLength(6);
    expect(client.stats()).toMatchObject({ exchanges: 2, batches: 1, queued: 0, inFlight: 0 });
    client.close();
  });

  it('a slow exchange does not hold the others: past slowMs another starts beside it', async () => {
    const target = new URL(own.agent.url);
    // Each exchange takes about 2 s on the wire; another may start 50 ms after the one in flight.
    await using proxy = await tcpProxy(
      { host: target.hostname, port: Number(target.port) },
      { delayMs: 1000 },
    );
    const client = new AgentClient({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      timeoutMs: 10_000,
      coalesce: { slowMs: 50 },
    });
    const subject = uniquePrefix('slow');
    const first = client.check('wide', subject);
    await turn();
    const rest = Array.from({ length: 5 }, () => client.check('wide', subject));
    await eventually(() => client.stats().inFlight === 2, 1500, 'a second exchange beside the slow one');
    expect(client.stats().queued).toBe(0);
    const decisions = await Promise.all([first, ...rest]);
    expect(decisions.filter((d) => d.allowed)).toHaveLength(6);
    expect(client.stats()).toMatchObject({ exchanges: 2, batches: 1 });
    client.close();
  });

  it('a whole batch waiting leaves at once, up to maxExchanges', async () => {
    const target = new URL(own.agent.url);
    await using proxy = await tcpProxy(
      { host: target.hostname, port: Number(target.port) },
      { delayMs: 200 },
    );
    const client = new AgentClient({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      timeoutMs: 5000,
      maxExchanges: 3,
      coalesce: { slowMs: 1000, maxBatch: 4 },
    });
    const subject = uniquePrefix('full');
    const first = client.check('wide', subject);
    await turn();
    // 11 more: two whole batches of 4 leave beside the first (3 in flight), 3 wait for one of them.
    const rest = Array.from({ length: 11 }, () => client.check('wide', subject));
    await turn();
    expect(client.stats()).toMatchObject({ inFlight: 3, queued: 3 });
    const decisions = await Promise.all([first, ...rest]);
    expect(decisions.filter((d) => d.allowed)).toHaveLength(12);
    expect(client.stats()).toMatchObject({ exchanges: 4, queued: 0, inFlight: 0 });
    client.close();
  });
});

describe('coalesced decisions through the batch route', () => {
  it('500 racing callers on a bucket of 100 admit exactly 100', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 5000 });
    const subject = uniquePrefix('race');
    const decisions = await Promise.all(Array.from({ length: 500 }, () => client.check('hundred', subject)));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(100);
    expect(decisions.filter((d) => d.degraded !== undefined)).toHaveLength(0);
    expect(client.stats().batches).toBeGreaterThan(0);
    client.close();
  });

  it('keeps layered checks all-or-nothing and independent requests independent', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 5000 });
    const subject = uniquePrefix('layered');
    const layered = {
      checks: [
        { policy: 'wide', subject },
        { policy: 'hundred', subject },
      ],
    };
    const [decisions, unknown, alone] = await Promise.all([
      Promise.all(Array.from({ length: 300 }, () => client.decide(layered))),
      client.check('no-such-policy', subject).catch((e: unknown) => e),
      client.check('wide', `${subject}-alone`),
    ]);
    expect(decisions.filter((d: Decision) => d.allowed)).toHaveLength(100);
    expect(unknown).toBeInstanceOf(AgentRequestError);
    expect(unknown).toMatchObject({ code: 'AGT_ERR_UNKNOWN_POLICY' });
    expect(alone.allowed).toBe(true);
    // `wide` was charged for the 100 admitted requests only: the denied ones gave nothing of it.
    const probe = await client.decide({ policy: 'wide', subject, dryRun: true });
    expect(probe.results[0]!.remaining).toBe(1000 - 100 - 1);
    client.close();
  });
});

describe("the client's own queue", () => {
  it('sheds beyond maxQueued: answered by the failure mode, counted apart, never a breaker failure', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, timeoutMs: 5000, maxQueued: 10, maxSockets: 1 });
    const subject = uniquePrefix('shed');
    const decisions = await Promise.all(Array.from({ length: 100 }, () => client.check('wide', subject)));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(10);
    const shed = decisions.filter((d) => d.failure === 'shed');
    expect(shed).toHaveLength(90);
    expect(shed[0]).toMatchObject({
      allowed: false,
      degraded: 'fail_closed',
      results: [{ reason: 'client_shed' }],
    });
    const stats = client.stats();
    expect(stats.shed).toBe(90);
    expect(Object.values(stats.failures).reduce((a, b) => a + b, 0)).toBe(0);
    expect(stats.breaker).toBe('closed');
    client.close();
  });

  it('the plugin answers a shed as its policy fails: 503 LIMITER_BUSY closed, 200 open', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url, maxQueued: 0 });
    const { app, url } = await service(client);
    try {
      const tenant = uniquePrefix('busy');
      expect(tally(await burst(`${url}/work`, tenant, 5))).toEqual({ '503 LIMITER_BUSY': 5 });
      expect(tally(await burst(`${url}/open`, tenant, 5))).toEqual({ 200: 5 });
      expect(client.stats().shed).toBe(10);
    } finally {
      await app.close();
      client.close();
    }
  });
});

describe('an agent that cannot answer still fails each policy as declared', () => {
  it('frozen (SIGSTOP): every request is answered while it is frozen, closed 503, open 200', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url });
    const { app, url } = await service(client);
    const tenant = uniquePrefix('frozen');
    own.agent.pause();
    let thawed = false;
    try {
      const [closed, open] = await Promise.all([
        burst(`${url}/work`, tenant, 200),
        burst(`${url}/open`, tenant, 200),
      ]);
      // Every answer came while the agent was still frozen: none waited for it.
      expect(thawed).toBe(false);
      expect(tally(closed)).toEqual({ '503 LIMITER_UNAVAILABLE': 200 });
      expect(tally(open)).toEqual({ 200: 200 });
      const { failures } = client.stats();
      expect(failures.timeout).toBeGreaterThan(0);
      expect(failures.timeout + failures.breaker_open).toBe(
        Object.values(failures).reduce((a, b) => a + b, 0),
      );
    } finally {
      thawed = true;
      own.agent.resume();
      await app.close();
      client.close();
    }
  });

  it('frozen: decisions queued behind the exchanges that wait it out are answered with them, never sent after', async () => {
    // No breaker: only the queue's own bound stops the decisions behind the 4 exchanges in flight (4 × 64) from
    // going out 4 batches at a time, each after the last timed out (1,000 decisions: 16 exchanges, 4 timeouts long).
    const client = new AgentClient({ baseUrl: own.agent.url, breaker: false, timeoutMs: 300 });
    const subject = uniquePrefix('frozen-queue');
    own.agent.pause();
    try {
      const decisions = await Promise.all(Array.from({ length: 1000 }, () => client.check('burst', subject)));
      expect(decisions.filter((d) => d.allowed)).toHaveLength(0);
      expect(decisions.filter((d) => d.results[0]?.reason === 'agent_unreachable')).toHaveLength(1000);
      const stats = client.stats();
      expect(stats.exchanges).toBe(4);
      expect(stats.failures).toMatchObject({ timeout: 1000, connection: 0, breaker_open: 0 });
      expect(stats.queued).toBe(0);
    } finally {
      own.agent.resume();
      client.close();
    }
  });

  it('a stalled event loop fails no queued decision: the agent answered, only this process was late', async () => {
    // One exchange of one decision at a time, so decisions queue; then this process blocks for longer than the
    // timeout while the agent answers the exchange in flight.
    const client = new AgentClient({
      baseUrl: own.agent.url,
      timeoutMs: 300,
      maxExchanges: 1,
      coalesce: { maxBatch: 1 },
    });
    const subject = uniquePrefix('stalled');
    const decisions = Promise.all(Array.from({ length: 6 }, () => client.check('wide', subject)));
    // The first exchange leaves (the turn's pump, then its write), and the agent answers it while this blocks.
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve));
    const until = performance.now() + 800;
    while (performance.now() < until) {
      // Busy: this process, not the agent, is late.
    }
    expect((await decisions).filter((d) => d.allowed)).toHaveLength(6);
    expect(Object.values(client.stats().failures).reduce((a, b) => a + b, 0)).toBe(0);
    client.close();
  });

  it('stopped: closed 503, open 200, counted as connection failures', async () => {
    const client = new AgentClient({ baseUrl: own.agent.url });
    const { app, url } = await service(client);
    const tenant = uniquePrefix('stopped');
    await own.agent[Symbol.asyncDispose]();
    try {
      const [closed, open] = await Promise.all([
        burst(`${url}/work`, tenant, 200),
        burst(`${url}/open`, tenant, 200),
      ]);
      expect(tally(closed)).toEqual({ '503 LIMITER_UNAVAILABLE': 200 });
      expect(tally(open)).toEqual({ 200: 200 });
      const { failures } = client.stats();
      expect(failures.connection).toBeGreaterThan(0);
      expect(failures.timeout).toBe(0);
    } finally {
      await app.close();
      client.close();
    }
  });
});

describe('an agent whose body limit was lowered (QP_BODY_LIMIT_BYTES=256: batches up to 4 KiB)', () => {
  const small = agentProcessOnOwnRedis({
    env: { QP_BODY_LIMIT_BYTES: '256' },
    policies: { wide: { capacity: 1000, refillPerSecond: 0.01 } },
  });

  it('a batch it refuses as too large goes again in smaller ones: every decision answered, none refused', async () => {
    const client = new AgentClient({ baseUrl: small.agent.url, timeoutMs: 2000 });
    const tenant = uniquePrefix('small');
    // 64 subjects of about 75 characters in one turn: one batch would be about 6.7 KB.
    const decisions = await Promise.all(
      Array.from({ length: 64 }, (_, i) =>
        client.decide({ policy: 'wide', subject: `${tenant}-${String(i).padStart(60, '0')}` }),
      ),
    );
    expect(decisions.filter((d) => d.allowed)).toHaveLength(64);
    const stats = client.stats();
    expect(stats.refused).toEqual({});
    expect(stats.failures).toMatchObject({ bad_status: 0, bad_body: 0, connection: 0, timeout: 0 });
    // The refused batch, then the same decisions in at least two smaller ones.
    expect(stats.batches).toBeGreaterThanOrEqual(3);
    expect(stats.decided).toBe(64);
    client.close();
  });

  it('a batch of subjects of 3-byte characters shrinks too: every decision settles, in a bounded number of exchanges', async () => {
    const client = new AgentClient({ baseUrl: small.agent.url, timeoutMs: 2000 });
    // 900 bytes a subject in 300 characters: the batch's size in characters is a third of its bytes. This agent
    // keys no such subject (no HMAC secret): each element is its own 400, which is all this test needs.
    const settled = await Promise.allSettled(
      Array.from({ length: 64 }, (_, i) =>
        client.decide({ policy: 'wide', subject: `${i}${'漢'.repeat(300)}` }),
      ),
    );
    expect(
      settled.map((s) => (s.status === 'rejected' ? (s.reason as AgentRequestError).code : 'decided')),
    ).toEqual(Array.from({ length: 64 }, () => 'AGT_ERR_INVALID_SUBJECT'));
    // Halving each time: at most 7 refused batches on the way down to batches the agent takes, then 64 decisions
    // in batches or alone.
    expect(client.stats().exchanges).toBeLessThanOrEqual(7 + 64);
    client.close();
  });
});
