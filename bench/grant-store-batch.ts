/**
 * `npx tsx bench/grant-store-batch.ts [--rounds 1500] [--size 32]`: what the agent and Redis spend on a turn of
 * `size` grant takes (distinct subjects), sent as one `lua/grant.lua` call carrying them all (the grant store's
 * coalescing) against `size` concurrent calls of one take each (what the store did before). Alternating blocks;
 * CPU µs per take of this process and of Redis (INFO cpu).
 */
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { grantRecordKey } from '../core/keys.js';
import { grantArguments, type EncodedGrant } from '../core/models/grant.js';
import { transferBucket } from '../core/models/transfer.js';
import { MICRO } from '../core/models/token-bucket.js';
import { RedisGrantStore } from '../regional-agent/grants/grant-store.js';
import { defineScript, runScript } from '../regional-agent/redis/scripts.js';
import { processBackend } from '../test/harness/process-backend.js';

const { values } = parseArgs({
  options: { rounds: { type: 'string', default: '1500' }, size: { type: 'string', default: '32' } },
});
const rounds = Number(values.rounds);
const size = Number(values.size);
await using server = await processBackend.startRedis();
const redis = new Redis(server.url);
const store = new RedisGrantStore(redis, { timeoutMs: 1000 });
const command = defineScript(redis, 'grant');
let n = 0;
const grant = (): EncodedGrant => {
  const key = `rl:v1:{t${n++ % 10_000}}:p`;
  return {
    key,
    record: grantRecordKey(key, String(n).padEnd(22, '_')),
    bucket: transferBucket({ key, capacity: 100, refillPerSecond: 100 / 60, ttlMs: 120_000 }),
    amount: MICRO,
  };
};
const ways = {
  'one call per turn': () => Promise.all(Array.from({ length: size }, () => store.take(grant()))),
  'a call per take': () =>
    Promise.all(
      Array.from({ length: size }, () => {
        const { keys, argv } = grantArguments('take', grant());
        return runScript(redis, command, keys, argv, 1000, 'grant script');
      }),
    ),
};
const redisCpu = async () => {
  const info = await redis.info('cpu');
  const v = (k: string) => Number(new RegExp(`${k}:([\\d.]+)`).exec(info)?.[1] ?? 0);
  return (v('used_cpu_sys') + v('used_cpu_user')) * 1e6;
};
const totals: Record<string, { self: number; redis: number; ms: number; takes: number }> = {};
for (let block = 0; block < 6; block++) {
  for (const [name, run] of Object.entries(ways)) {
    const c0 = process.cpuUsage();
    const r0 = await redisCpu();
    const t0 = performance.now();
    for (let i = 0; i < rounds / 3; i++) await run();
    const t = (totals[name] ??= { self: 0, redis: 0, ms: 0, takes: 0 });
    t.ms += performance.now() - t0;
    const c = process.cpuUsage(c0);
    t.self += c.user + c.system;
    t.redis += (await redisCpu()) - r0;
    t.takes += (rounds / 3) * size;
  }
}
for (const [name, t] of Object.entries(totals)) {
  console.log(
    `${name}: ${(t.self / t.takes).toFixed(1)} µs CPU per take here, ${(t.redis / t.takes).toFixed(1)} in Redis, ` +
      `${Math.round((t.takes / t.ms) * 1000)} takes/s`,
  );
}
redis.disconnect();
