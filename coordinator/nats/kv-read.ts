/**
 * Read every key's latest entry of a JetStream KV bucket without a consumer: the keys from the stream's subject
 * index (one stream info request, which the stream leader answers), then each key's last value, side by side,
 * through the KV view given: a bound view (`Kvm.open`) asks the stream leader; one that allows direct gets may be
 * answered by a replica that lags, so a start reads through a bound view. Creating a consumer (what `kv.keys()` does) goes through JetStream's meta leader and a proposal of
 * its own, several round trips across regions, and an ordered consumer's listing has no deadline of its own; every
 * request here has the client's timeout. For a coordinator's start and takeover, where the lost region's streams
 * may just have elected their leaders.
 */
import type { JetStreamManager } from '@nats-io/jetstream';
import type { KV, KvEntry } from '@nats-io/kv';

/** Most value reads in flight at once. */
const READ_CONCURRENCY = 32;

/** The keys `bucket` holds an entry for (deletion markers included). */
export async function bucketKeys(jsm: JetStreamManager, bucket: string): Promise<string[]> {
  const prefix = `$KV.${bucket}.`;
  const info = await jsm.streams.info(`KV_${bucket}`, { subjects_filter: `${prefix}>` });
  return Object.keys(info.state.subjects ?? {})
    .filter((subject) => subject.startsWith(prefix))
    .map((subject) => subject.slice(prefix.length));
}

/** The latest entry of each key (null where none is left), READ_CONCURRENCY reads at a time. */
export async function latestEntries(
  kv: Pick<KV, 'get'>,
  keys: readonly string[],
): Promise<(KvEntry | null)[]> {
  const read: (KvEntry | null)[] = [];
  for (let at = 0; at < keys.length; at += READ_CONCURRENCY) {
    read.push(...(await Promise.all(keys.slice(at, at + READ_CONCURRENCY).map((key) => kv.get(key)))));
  }
  return read;
}
