/**
 * The highest coordinator epoch the allocation records carry: a new leader's epoch is above it, so agents never
 * refuse the new leader's records even if the leader-lease bucket itself was lost.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';

export async function highestRecordEpoch(
  nc: NatsConnection,
  bucket: string,
  timeoutMs: number,
): Promise<number> {
  let highest = 0;
  const keys: string[] = [];
  let kv;
  try {
    kv = await new Kvm(jetstream(nc, { timeout: timeoutMs })).open(bucket);
    for await (const key of await kv.keys()) keys.push(key);
  } catch {
    return 0; // No bucket yet: no record carries an epoch.
  }
  for (const key of keys) {
    const entry = await kv.get(key);
    if (entry === null || entry.operation !== 'PUT') continue;
    try {
      const epoch = entry.json<{ leaderEpoch?: unknown }>().leaderEpoch;
      if (typeof epoch === 'number' && Number.isSafeInteger(epoch) && epoch > highest) highest = epoch;
    } catch {
      // An unreadable entry carries no epoch.
    }
  }
  return highest;
}
