/**
 * The highest coordinator epoch the allocation records carry: a new leader's epoch is above it, so agents never
 * refuse the new leader's records even if the leader-lease bucket itself was lost. Read when a standby takes the
 * lease, so without a consumer (coordinator/nats/kv-read.ts): every request has a deadline, and none goes through
 * JetStream's meta leader (an ordered consumer's listing has no deadline, and once held a takeover past its bound).
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { bucketKeys, latestEntries } from '../nats/kv-read.js';

export async function highestRecordEpoch(
  nc: NatsConnection,
  bucket: string,
  timeoutMs: number,
): Promise<number> {
  let highest = 0;
  let keys: string[];
  let kv;
  const jsm = await jetstreamManager(nc, { timeout: timeoutMs, checkAPI: false });
  try {
    kv = await new Kvm(jetstream(nc, { timeout: timeoutMs, checkAPI: false })).open(bucket);
    keys = await bucketKeys(jsm, bucket);
  } catch {
    return 0; // No bucket yet: no record carries an epoch.
  }
  for (const entry of await latestEntries(kv, keys)) {
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
