/**
 * A region's Redis under Sentinel, with real promotions: the master is killed mid-burst; the agent answers each
 * decision as its policy's failure mode declares during the switch, follows the promoted replica without a
 * restart (its script cache empty: NOSCRIPT answered by EVAL), and counts what the failover forgot. With
 * `WAIT` acknowledgement (QP_REDIS_WAIT_REPLICAS) it forgets no admission.
 */
import { createHash } from 'node:crypto';
import calculateSlot from 'cluster-key-slot';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { DecisionResponse } from '../../../../core/wire/agent.js';
import { bucketKey } from '../../../../core/keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import type { connectRedis, RedisTarget } from '../../../../regional-agent/redis/connect.js';
import { ackReplicas, luaSource, type ReplicaAck } from '../../../../regional-agent/redis/scripts.js';
import {
  startReplicatedCluster,
  startSentinelGroup,
  type SentinelGroup,
} from '../../../helpers/redis-sentinel.js';
import { eventually } from '../../../helpers/wait.js';
import { agentFixture } from '../../../helpers/agent-fixture.js';

const CAPACITY = 300;
const WORKERS = 8;
/**
 * Stated bound: Sentinel's down-after (1 s here) + election and promotion + reconnection: 2.6-2.9 s measured on
 * this machine. The margin covers a failover attempt Sentinel abandons and retries (2 × failover-timeout) on a
 * machine whose two cores other suites share.
 */
const RECOVERY_BOUND_MS = 30_000;

const policy = parsePolicy({
  name: 'orders',
  capacity: CAPACITY,
  // Refills less than one token over the whole test: every admission is a token of the original 300.
  refillPerSecond: 0.001,
  onStoreFailure: 'closed',
});

interface Answer {
  at: number;
  allowed: boolean;
  reason: string | undefined;
}

async function scriptLoaded(port: number, sha: string): Promise<boolean> {
  const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0 });
  client.on('error', () => undefined);
  try {
    const [exists] = (await client.call('SCRIPT', 'EXISTS', sha)) as number[];
    return exists === 1;
  } finally {
    client.disconnect();
  }
}

/** An agent deciding `orders` for one subject on a test's Redis, and its connection (closed on dispose). */
interface Agent extends AsyncDisposable {
  readonly redis: ReturnType<typeof connectRedis>;
  /** One decision of cost 1 for the subject, answered 200. */
  decide(): Promise<Answer>;
  /** Any decision body, answered 200: its answer as the agent wrote it. */
  decideBody(payload: object): Promise<DecisionResponse>;
}

/**
 * Build an agent on `target` (a Sentinel group or a cluster) deciding for `subject`; with `ack`, every script
 * call waits for that many replicas (as QP_REDIS_WAIT_REPLICAS does). `config` adds to the agent's configuration.
 */
async function agentOn(
  target: RedisTarget,
  subject: string,
  options: { ack?: ReplicaAck; config?: Record<string, unknown> } = {},
): Promise<Agent> {
  const fixture = await agentFixture({
    policies: [policy],
    redis: { target },
    config: { decisionDeadlineMs: 400, storeTimeoutMs: 300, ...options.config },
  });
  const { agent, redis } = fixture;
  if (options.ack !== undefined) ackReplicas(redis, options.ack);
  const decideBody = async (payload: object): Promise<DecisionResponse> => {
    const res = await agent.app.inject({ method: 'POST', url: '/v1/decisions', payload });
    expect(res.statusCode).toBe(200);
    return DecisionResponse.parse(res.json());
  };
  return {
    redis,
    async decide() {
      const body = await decideBody({ policy: 'orders', subject });
      return { at: performance.now(), allowed: body.allowed, reason: body.results[0]!.reason };
    },
    decideBody,
    [Symbol.asyncDispose]: () => fixture[Symbol.asyncDispose](),
  };
}

/**
 * Drain the subject's bucket: every token the store still holds is handed out, then subject_exhausted; returns
 * how many were admitted. With `waitOutMs`, store_unavailable answers are waited out that long in all (a replica
 * re-pointed to a new master may still be syncing: until it acknowledges, a WAIT decision fails as its policy
 * says), never counted as tokens.
 */
async function drain(agent: Agent, waitOutMs?: number): Promise<number> {
  const by = performance.now() + (waitOutMs ?? 0);
  const next = async (): Promise<Answer> => {
    let a = await agent.decide();
    if (waitOutMs === undefined) return a;
    await eventually(
      async () => {
        if (a.allowed || a.reason !== 'store_unavailable') return true;
        a = await agent.decide();
        return false;
      },
      Math.max(0, by - performance.now()),
      'a decision the store answers after the failover',
      50,
    );
    return a;
  };
  let drained = 0;
  for (;;) {
    const a = await next();
    if (!a.allowed) {
      expect(a.reason).toBe('subject_exhausted');
      return drained;
    }
    drained++;
    expect(drained).toBeLessThanOrEqual(CAPACITY);
  }
}

/** Wait (bounded) until the sentinels name one of the group's replicas as the master; returns its port. */
async function promotedReplica(group: SentinelGroup): Promise<number> {
  let port = group.master.port;
  await eventually(
    async () => {
      port = await group.currentMasterPort();
      return group.replicas.some((r) => r.port === port);
    },
    RECOVERY_BOUND_MS,
    'the sentinels name a promoted replica',
    100,
  );
  return port;
}

describe.each([
  { waitReplicas: 0, replicas: 1 },
  // WAIT 1 with two replicas: after the promotion the other replica follows the new master and acknowledges.
  { waitReplicas: 1, replicas: 2 },
])('an agent on Redis under Sentinel (WAIT $waitReplicas)', ({ waitReplicas, replicas }) => {
  it('keeps deciding through a master killed mid-burst and bounds what the failover forgets', async () => {
    await using group = await startSentinelGroup({ replicas });
    await using agent = await agentOn(
      { redisSentinels: group.sentinelNodes, redisMasterName: group.masterName },
      'tenant-a',
      {
        ...(waitReplicas > 0 ? { ack: { replicas: waitReplicas, timeoutMs: 200 } } : {}),
        config: { redisWaitReplicas: waitReplicas, breakerResetMs: 200, breakerVolumeThreshold: 5 },
      },
    );
    const sha = createHash('sha1').update(luaSource('token_bucket')).digest('hex');
    const answers: Answer[] = [];
    let killedAt: number | undefined;
    let kill: Promise<void> | undefined;
    // Workers send one decision after another; the 100th answer kills the master while the others are in
    // flight; they go on until decisions are normal again for 20 answers after the switch.
    const normalAfterKill = () =>
      killedAt === undefined
        ? 0
        : answers.filter((a) => a.at > killedAt! && a.reason === undefined && a.allowed).length;
    const worker = async () => {
      while (
        normalAfterKill() < 20 &&
        performance.now() - (killedAt ?? performance.now()) < RECOVERY_BOUND_MS
      ) {
        answers.push(await agent.decide());
        if (answers.length === 100 && kill === undefined) {
          // Before the kill the replicas never ran the script: the new master will answer NOSCRIPT first.
          expect(await scriptLoaded(group.replicas[0]!.port, sha)).toBe(false);
          // Counted from the moment the process is gone: answers before that may still come from it.
          kill = group.master.kill().then(() => {
            killedAt = performance.now();
          });
        }
      }
    };
    await Promise.all(Array.from({ length: WORKERS }, worker));
    await kill;
    expect(killedAt).toBeDefined();
    // The sentinel asked may learn of the switch after the agent's client did (hello messages every 2 s).
    const promoted = await promotedReplica(group);
    expect(promoted).not.toBe(group.master.port);
    // Every answer is an ordinary admission or the policy's declared failure: closed, store_unavailable.
    for (const a of answers) {
      if (a.allowed) expect(a.reason).toBeUndefined();
      else expect(a.reason).toBe('store_unavailable');
    }
    const firstNormal = answers.find((a) => a.at > killedAt! && a.allowed && a.reason === undefined);
    expect(
      firstNormal,
      `no normal decision within ${RECOVERY_BOUND_MS} ms of the kill: the sentinels name port ${promoted} ` +
        `(the killed master was ${group.master.port}); the client is ${agent.redis.status}`,
    ).toBeDefined();
    const recoveryMs = firstNormal!.at - killedAt!;
    expect(recoveryMs).toBeLessThan(RECOVERY_BOUND_MS);
    // The promoted replica had no script: the agent's EVALSHA met NOSCRIPT and loaded it with EVAL.
    expect(await scriptLoaded(promoted, sha)).toBe(true);

    const drained = await drain(agent, RECOVERY_BOUND_MS);
    const admitted = answers.filter((a) => a.allowed).length + drained;
    const failed = answers.filter((a) => !a.allowed).length;
    const forgotten = Math.max(0, admitted - CAPACITY);
    console.info(
      `sentinel failover (WAIT ${waitReplicas}): ${answers.length} answers in the burst, ${failed} store_unavailable, ` +
        `normal again ${Math.round(recoveryMs)} ms after the kill; ${admitted} of ${CAPACITY} admitted in all ` +
        `(${forgotten} forgotten by the promotion)`,
    );
    // A token is spent without an admission only by a decision answered as a failure (in flight at the kill, or
    // timed out while the store ran it): never more lost tokens than failure answers.
    expect(admitted).toBeGreaterThanOrEqual(CAPACITY - failed);
    // With WAIT, every answered admission was on a replica before its answer: the promotion forgets none.
    if (waitReplicas > 0) expect(admitted).toBeLessThanOrEqual(CAPACITY);
  }, 90_000);
});

// What a promotion forgets, exactly: the replica's link is cut (its replication lag grows with every write),
// LAGGED admissions are answered by the master alone, then the master dies and the lagging replica is promoted.
const LAGGED = 40;

describe.each([
  { waitReplicas: 0, forgotten: LAGGED },
  { waitReplicas: 1, forgotten: 0 },
])('a promotion after a replication lag (WAIT $waitReplicas)', ({ waitReplicas, forgotten }) => {
  it(`re-admits exactly ${forgotten} tokens: the admissions the replica never received`, async () => {
    // Two replicas: after the promotion the other one follows the new master, so WAIT 1 can be met again.
    await using group = await startSentinelGroup({ replicas: 2, replicationLinks: true });
    await using agent = await agentOn(
      { redisSentinels: group.sentinelNodes, redisMasterName: group.masterName },
      'tenant-b',
      {
        ...(waitReplicas > 0 ? { ack: { replicas: waitReplicas, timeoutMs: 50 } } : {}),
        // Every failure counts toward nothing: this test reads each decision's own outcome.
        config: { redisWaitReplicas: waitReplicas, breakerVolumeThreshold: 10_000 },
      },
    );
    for (let i = 0; i < 100; i++) expect((await agent.decide()).allowed).toBe(true);
    await Promise.all(group.links.map((l) => l.cut()));
    const lagged: Answer[] = [];
    for (let i = 0; i < LAGGED; i++) lagged.push(await agent.decide());
    // Without WAIT the master answers alone; with WAIT no replica acknowledges, so each fails closed.
    expect(lagged.filter((a) => a.allowed)).toHaveLength(waitReplicas === 0 ? LAGGED : 0);
    for (const a of lagged) if (!a.allowed) expect(a.reason).toBe('store_unavailable');
    await group.master.kill();
    await promotedReplica(group);
    const drained = await drain(agent, RECOVERY_BOUND_MS);
    const admitted = 100 + lagged.filter((a) => a.allowed).length + drained;
    console.info(
      `lagging replica promoted (WAIT ${waitReplicas}): ${admitted} of ${CAPACITY} admitted, ${admitted - CAPACITY} forgotten`,
    );
    expect(admitted - CAPACITY).toBe(forgotten);
  }, 90_000);
});

/** Until every replica of `node` has acknowledged the master's replication offset (INFO replication). */
async function caughtUp(node: { host: string; port: number }): Promise<void> {
  const client = new Redis({ host: node.host, port: node.port, maxRetriesPerRequest: 0 });
  try {
    await eventually(
      async () => {
        const info = await client.info('replication');
        const offset = Number(/master_repl_offset:(\d+)/.exec(info)?.[1] ?? NaN);
        const replicas = [...info.matchAll(/^slave\d+:.*offset=(\d+)/gm)].map((m) => Number(m[1]));
        return replicas.length > 0 && replicas.every((r) => r >= offset);
      },
      10_000,
      'the replica has every write of the master',
      20,
    );
  } finally {
    client.disconnect();
  }
}

describe('an agent on a Redis Cluster with a replica per master', () => {
  it('follows the promotion of the replica of a master killed mid-burst', async () => {
    await using cluster = await startReplicatedCluster();
    await using agent = await agentOn({ redisClusterNodes: cluster.seeds }, 'tenant-c', {
      config: { breakerResetMs: 200, breakerVolumeThreshold: 5 },
    });
    const slot = calculateSlot(bucketKey(policy.version, 'tenant-c', 'orders'));
    const master = await cluster.masterOf(slot);
    const answers: Answer[] = [];
    for (let i = 0; i < 100; i++) answers.push(await agent.decide());
    // What this test is about is the switch, not a lag: the kill comes once the replica has every write (on a
    // loaded machine it once lacked 97 of the 100 admissions at the kill, and the promotion re-admitted them).
    await caughtUp(master);
    await master.kill();
    const killedAt = performance.now();
    // Callers keep deciding through the switch until 20 normal answers came from the promoted replica.
    const normal = () => answers.filter((a) => a.at > killedAt && a.allowed).length;
    const worker = async () => {
      while (normal() < 20 && performance.now() - killedAt < RECOVERY_BOUND_MS)
        answers.push(await agent.decide());
    };
    await Promise.all(Array.from({ length: WORKERS }, worker));
    for (const a of answers) {
      if (a.allowed) expect(a.reason).toBeUndefined();
      else expect(a.reason).toBe('store_unavailable');
    }
    const firstNormal = answers.find((a) => a.at > killedAt && a.allowed);
    expect(firstNormal).toBeDefined();
    // The agent decides on the promoted replica; every node's view of the slot follows by gossip.
    await eventually(
      async () => (await cluster.masterOf(slot)) !== master,
      10_000,
      'every node names the promoted replica as the slot’s master',
      100,
    );
    const drained = await drain(agent);
    const admitted = answers.filter((a) => a.allowed).length + drained;
    console.info(
      `cluster failover: normal again ${Math.round(firstNormal!.at - killedAt)} ms after the kill; ` +
        `${admitted} of ${CAPACITY} admitted (${Math.max(0, admitted - CAPACITY)} forgotten by the promotion)`,
    );
    // The admissions before the kill were replicated before it: nothing is forgotten here; and a token is spent
    // without an admission only by a decision answered as a failure.
    expect(admitted).toBeLessThanOrEqual(CAPACITY);
    expect(admitted).toBeGreaterThanOrEqual(CAPACITY - answers.filter((a) => !a.allowed).length);
  }, 90_000);
});

describe('an agent on Redis under Sentinel, its master frozen (SIGSTOP)', () => {
  it('follows the promotion while the old master is still frozen, and never decides on it again', async () => {
    await using group = await startSentinelGroup({ replicas: 1 });
    await using agent = await agentOn(
      { redisSentinels: group.sentinelNodes, redisMasterName: group.masterName },
      'tenant-f',
      { config: { breakerResetMs: 200, breakerVolumeThreshold: 5 } },
    );
    for (let i = 0; i < 50; i++) expect((await agent.decide()).allowed).toBe(true);
    // Frozen, not dead: the agent's socket stays open and the master answers nothing; no READONLY either.
    await group.master.pause();
    const frozenAt = performance.now();
    try {
      const promoted = await promotedReplica(group);
      expect(promoted).not.toBe(group.master.port);
      // Decisions are normal again on the promoted replica, the old master still frozen (before, the client
      // waited on the frozen master until it was thawed and demoted: every decision failed meanwhile).
      let normal: Answer | undefined;
      await eventually(
        async () => {
          const a = await agent.decide();
          if (a.allowed && a.reason === undefined) normal = a;
          return normal !== undefined;
        },
        RECOVERY_BOUND_MS,
        `a normal decision with the old master frozen (the client is ${agent.redis.status})`,
        100,
      );
      console.info(`frozen master: normal again ${Math.round(normal!.at - frozenAt)} ms after the freeze`);
    } finally {
      await group.master.resume();
    }
    // Thawed, the old master is demoted in time; meanwhile the agent decides on the new master only: the 250
    // tokens left there, not the old master's too.
    const drained = await drain(agent, RECOVERY_BOUND_MS);
    expect(drained).toBeLessThanOrEqual(CAPACITY - 50);
  }, 90_000);
});

describe('an agent whose writes no replica acknowledges (WAIT 1)', () => {
  it('keeps no idempotency record of a decision it answered as a failure: the retry is decided afresh', async () => {
    await using group = await startSentinelGroup({ replicas: 1, replicationLinks: true });
    await using agent = await agentOn(
      { redisSentinels: group.sentinelNodes, redisMasterName: group.masterName },
      'tenant-w',
      {
        ack: { replicas: 1, timeoutMs: 50 },
        config: { redisWaitReplicas: 1, breakerVolumeThreshold: 10_000 },
      },
    );
    const body = { policy: 'orders', subject: 'tenant-w', idempotencyKey: 'order-7' };
    await Promise.all(group.links.map((l) => l.cut()));
    const failed = await agent.decideBody(body);
    expect(failed.allowed).toBe(false);
    expect(failed.results[0]!.reason).toBe('store_unavailable');
    await Promise.all(group.links.map((l) => l.restore()));
    await caughtUp(group.master);
    // The retry, once replicas acknowledge again: a new decision, not a replay of the admission the master
    // recorded for the call its caller was told failed (replayed: true before).
    const retry = await agent.decideBody(body);
    expect(retry.allowed).toBe(true);
    expect(retry.replayed).toBeUndefined();
    const again = await agent.decideBody(body);
    expect(again.replayed).toBe(true);
  }, 60_000);
});

describe('an agent whose master lost its script cache (SCRIPT FLUSH), its replica frozen (WAIT 1)', () => {
  it('answers no admission that no replica acknowledged: the script EVAL resent after NOSCRIPT is waited for too', async () => {
    await using group = await startSentinelGroup({ replicas: 1 });
    await using agent = await agentOn(
      { redisSentinels: group.sentinelNodes, redisMasterName: group.masterName },
      'tenant-n',
      {
        ack: { replicas: 1, timeoutMs: 50 },
        config: { redisWaitReplicas: 1, breakerVolumeThreshold: 10_000 },
      },
    );
    // Two decisions: the script is on this connection (the second is sent as EVALSHA) and the replica has both.
    expect((await agent.decide()).allowed).toBe(true);
    expect((await agent.decide()).allowed).toBe(true);
    await caughtUp(group.master);
    const admin = new Redis({ host: group.master.host, port: group.master.port, maxRetriesPerRequest: 0 });
    await admin.script('FLUSH');
    admin.disconnect();
    const [replica] = group.replicas;
    await replica!.pause();
    try {
      // The replica acknowledges nothing now: a decision must fail as its policy says (closed), never admit.
      const frozen = await agent.decide();
      expect(frozen).toMatchObject({ allowed: false, reason: 'store_unavailable' });
    } finally {
      await replica!.resume();
    }
  }, 60_000);
});
