/**
 * A flood of one-shot identities against a policy with a subject-creation cap, measured (not a CI test: the
 * bounded version is test/integration/regional-agent/redis/subject-creation-cap.test.ts).
 *
 *   npx tsx bench/subject-flood.ts model [n=1000000]   the reference model, in virtual time: n identities spread
 *                                                       over ten minutes, live keys sampled every second
 *   npx tsx bench/subject-flood.ts redis [n=1000000]   the agent's decision path (DecisionService, no HTTP) on a
 *                                                       Redis of its own, 512 in flight, keys counted with SCAN
 *   npx tsx bench/subject-flood.ts known [n]           known subjects only: decisions/s with and without a cap
 *
 * Both keep one known tenant deciding throughout and print what it was admitted.
 */
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { bucketKey } from '../core/keys.js';
import { parsePolicy } from '../core/policy/policy.js';
import { sizedBucket } from '../core/shares/share-sizing.js';
import { StaticShareView } from '../core/shares/shares.js';
import { creationKey, sharedBucketKey, SubjectCreationModel } from '../core/models/subject-creation.js';
import { buildApp } from '../regional-agent/app.js';
import { AgentConfig } from '../regional-agent/config.js';
import { StaticPolicySource } from '../regional-agent/policies/static-policy-source.js';
import { RedisDecisionStore } from '../regional-agent/redis/decision-store.js';
import { processBackend } from '../test/harness/process-backend.js';

const PER_MINUTE = 100;
/** A tenant's quota: 10 burst, 1 per second; idle buckets live 60 s (the default floor). */
const policy = parsePolicy({
  name: 'login',
  capacity: 10,
  refillPerSecond: 1,
  newSubjects: { perMinute: PER_MINUTE, flood: 'deny' },
});

function model(n: number): void {
  const m = new SubjectCreationModel();
  const start = 1_750_000_000_000_000;
  const spanUs = 600 * 1_000_000;
  const shared = sizedBucket(policy, sharedBucketKey(1, policy.name), 1, 1);
  const known = sizedBucket(policy, bucketKey(1, 'tenant-known', policy.name), 1, 1);
  const steps = { known: 0, created: 0, flood: 0 };
  let knownAdmitted = 0;
  let knownAsked = 0;
  let maxLive = 0;
  let nextSample = start;
  const began = performance.now();
  for (let i = 0; i < n; i++) {
    const now = start + Math.floor((i * spanUs) / n);
    // The known tenant asks 2 per second: its rate is 1, so about half are admitted, never a flood answer.
    if (i % Math.max(1, Math.floor(n / 1200)) === 0) {
      const d = m.decide(policy, known, shared, now);
      knownAsked++;
      if (d.step === 'flood') throw new Error('the known tenant got a flood answer');
      if (d.reply?.allowed === true) knownAdmitted++;
    }
    const subject = sizedBucket(policy, bucketKey(1, `one-shot-${i}`, policy.name), 1, 1);
    steps[m.decide(policy, subject, shared, now).step]++;
    if (now >= nextSample) {
      maxLive = Math.max(maxLive, m.bucketKeys(now));
      nextSample += 1_000_000;
    }
  }
  const ms = performance.now() - began;
  console.log(
    JSON.stringify(
      {
        mode: 'model',
        identities: n,
        virtualSeconds: 600,
        perMinute: PER_MINUTE,
        created: steps.created,
        floodAnswers: steps.flood,
        maxLiveBucketKeys: maxLive,
        knownTenant: { asked: knownAsked, admitted: knownAdmitted },
        wallMs: Math.round(ms),
      },
      null,
      2,
    ),
  );
}

async function redis(n: number): Promise<void> {
  await using server = await processBackend.startRedis();
  const client = new Redis(server.url);
  const built = buildApp(
    {
      store: new RedisDecisionStore(client, { timeoutMs: 5000 }),
      policies: new StaticPolicySource([policy]),
      shares: new StaticShareView({ login: 1 }),
      log: pino({ level: 'silent' }),
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: server.url,
      policiesFile: 'unused',
      decisionDeadlineMs: 5000,
      storeTimeoutMs: 5000,
      reservationSweepMs: 0,
    }),
  );
  await built.ready;
  const counts = { allowed: 0, flood: 0, other: 0 };
  let knownAdmitted = 0;
  let knownAsked = 0;
  let knownFlooded = 0;
  let next = 0;
  const began = performance.now();
  const worker = async () => {
    while (next < n) {
      const i = next++;
      if (i % 1000 === 0) {
        const d = await built.service.decideBody({ policy: 'login', subject: 'tenant-known' }, `k${i}`);
        knownAsked++;
        if (d.allowed) knownAdmitted++;
        if (d.results[0]?.reason === 'subject_flood') knownFlooded++;
      }
      const d = await built.service.decideBody({ policy: 'login', subject: `one-shot-${i}` }, `r${i}`);
      if (d.allowed) counts.allowed++;
      else if (d.results[0]?.reason === 'subject_flood') counts.flood++;
      else counts.other++;
      if (i % 100_000 === 0 && i > 0) console.error(`${i} decided`);
    }
  };
  await Promise.all(Array.from({ length: 512 }, worker));
  const ms = performance.now() - began;
  let keys = 0;
  let cursor = '0';
  do {
    const [c, found] = await client.scan(cursor, 'MATCH', `rl:v1:*:login`, 'COUNT', 1000);
    cursor = c;
    keys += found.length;
  } while (cursor !== '0');
  console.log(
    JSON.stringify(
      {
        mode: 'redis',
        identities: n,
        perMinute: PER_MINUTE,
        seconds: Math.round(ms / 100) / 10,
        decisionsPerSecond: Math.round(((n + knownAsked) * 1000) / ms),
        newSubjectsAdmitted: counts.allowed,
        floodAnswers: counts.flood,
        otherRefusals: counts.other,
        bucketKeysAfter: keys,
        creationLogEntries: await client.zcard(creationKey('login')),
        knownTenant: { asked: knownAsked, admitted: knownAdmitted, flooded: knownFlooded },
        redisUsedMemory: (await client.info('memory')).match(/used_memory_human:(\S+)/)?.[1],
      },
      null,
      2,
    ),
  );
  await built.app.close();
  client.disconnect();
}

/**
 * Known subjects only: n decisions round-robin over 1,000 tenants that already have buckets, on the capped policy
 * and on the same policy without a cap, alternating rounds: what the cap costs a known subject.
 */
async function known(n: number): Promise<void> {
  await using server = await processBackend.startRedis();
  const client = new Redis(server.url);
  const uncapped = parsePolicy({ name: 'plain', capacity: 1e6, refillPerSecond: 1e6 });
  const capped = parsePolicy({
    name: 'capped',
    capacity: 1e6,
    refillPerSecond: 1e6,
    newSubjects: { perMinute: 100_000, flood: 'deny' },
  });
  const built = buildApp(
    {
      store: new RedisDecisionStore(client, { timeoutMs: 5000 }),
      policies: new StaticPolicySource([uncapped, capped]),
      shares: new StaticShareView({ plain: 1, capped: 1 }),
      log: pino({ level: 'silent' }),
    },
    AgentConfig.parse({
      region: 'us',
      redisUrl: server.url,
      policiesFile: 'unused',
      decisionDeadlineMs: 5000,
      storeTimeoutMs: 5000,
      reservationSweepMs: 0,
    }),
  );
  await built.ready;
  const run = async (policy: string): Promise<number> => {
    let next = 0;
    let denied = 0;
    const began = performance.now();
    const worker = async () => {
      while (next < n) {
        const i = next++;
        const d = await built.service.decideBody({ policy, subject: `tenant-${i % 1000}` }, `q${i}`);
        if (!d.allowed) denied++;
      }
    };
    await Promise.all(Array.from({ length: 256 }, worker));
    if (denied > 0) throw new Error(`${denied} known-subject decisions were denied`);
    return Math.round((n * 1000) / (performance.now() - began));
  };
  // Create the tenants' buckets first (1,000 creations of the capped policy's 100,000).
  await run('capped');
  await run('plain');
  const rounds: { capped: number; plain: number }[] = [];
  for (let r = 0; r < 5; r++) rounds.push({ plain: await run('plain'), capped: await run('capped') });
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  console.log(
    JSON.stringify({
      mode: 'known',
      decisionsPerRound: n,
      rounds,
      medianPerSecond: {
        plain: median(rounds.map((r) => r.plain)),
        capped: median(rounds.map((r) => r.capped)),
      },
    }),
  );
  await built.app.close();
  client.disconnect();
}

const [mode = 'model', count = '1000000'] = process.argv.slice(2);
const n = Number(count);
if (mode === 'redis') await redis(n);
else if (mode === 'known') await known(n);
else model(n);
