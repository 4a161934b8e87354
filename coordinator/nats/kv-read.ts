/**
 * Read every key's latest entry of a JetStream KV bucket without a consumer: the keys from the stream's subject
 * index (one stream info request, which the stream leader answers), then each key's last value, side by side,
 * through the KV view given: a bound view (`Kvm.open`) asks the stream leader; one that allows direct gets may be
 * answered by a replica that lags, so a start reads through a bound view. Creating a consumer (what `kv.keys()` does) goes through JetStream's meta leader and a proposal of
 * its own, several round trips across regions, and an ordered consumer's listing has no deadline of its own; every
 * request here has the client's timeout. For a coordinator's start and takeover, where the lost region's streams
 * may just have elected their leaders.
 */
import {
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamManager,
  type StreamInfo,
} from '@nats-io/jetstream';
import type { KV, KvEntry, Kvm, KvOptions } from '@nats-io/kv';
import type { Step } from '../start-steps.js';

/** Most value reads in flight at once. */
const READ_CONCURRENCY = 32;

/** The keys `bucket` holds an entry for (deletion markers included). */
export async function bucketKeys(jsm: Pick<JetStreamManager, 'streams'>, bucket: string): Promise<string[]> {
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

/** Whether `error` says the stream does not exist. */
function streamNotFound(error: unknown): boolean {
  return (
    (error instanceof JetStreamApiError && error.code === JetStreamApiCodes.StreamNotFound) ||
    (error instanceof Error && /stream not found/i.test(error.message))
  );
}

export interface OpenedBucket {
  /** The bucket for writes (direct gets where the stream allows them, as `Kvm.create` opens it). */
  readonly kv: KV;
  /** A view that reads through the stream's leader, for the values of `keys`. */
  readonly reader: KV;
  /** The keys the bucket held an entry for (deletion markers included) when it was opened. */
  readonly keys: string[];
}

/**
 * Open `bucket` for a start with one request where `Kvm.create`, a replica check and the subject index took three:
 * one stream info with the subject index (the stream leader answers; `kvm` must not check the account, see
 * kv-read's header). The bucket is created (`Kvm.create`) when it does not exist, and scaled to `replicas` when it
 * has another count (both through JetStream's meta leader, which a takeover of an existing deployment never needs).
 */
export async function openBucket(
  kvm: Pick<Kvm, 'create' | 'open'>,
  jsm: Pick<JetStreamManager, 'streams'>,
  bucket: string,
  options: Partial<KvOptions> & { replicas: number },
): Promise<OpenedBucket> {
  const stream = `KV_${bucket}`;
  let info: StreamInfo;
  try {
    info = await jsm.streams.info(stream, { subjects_filter: `$KV.${bucket}.>` });
  } catch (error) {
    if (!streamNotFound(error)) throw error;
    const kv = await kvm.create(bucket, options);
    return { kv, reader: await kvm.open(bucket), keys: await bucketKeys(jsm, bucket) };
  }
  if (info.config.num_replicas !== options.replicas) {
    await jsm.streams.update(stream, { ...info.config, num_replicas: options.replicas });
  }
  const prefix = `$KV.${bucket}.`;
  const keys = Object.keys(info.state.subjects ?? {})
    .filter((subject) => subject.startsWith(prefix))
    .map((subject) => subject.slice(prefix.length));
  const kv = await kvm.open(bucket, { allow_direct: info.config.allow_direct });
  return { kv, reader: await kvm.open(bucket), keys };
}

/**
 * Open `bucket` (openBucket) and read every key's latest entry through its leader (deletion markers included; keys
 * with nothing left are dropped), as two steps of a start: `${what}_bucket`, then `${what}_values`. One that fails
 * (a stream leader still being elected) is tried again on its own; the other stands.
 */
export async function openAndRead(options: {
  kvm: Pick<Kvm, 'create' | 'open'>;
  jsm: Pick<JetStreamManager, 'streams'>;
  bucket: string;
  settings: Partial<KvOptions> & { replicas: number };
  what: string;
  step?: Step | undefined;
}): Promise<{ kv: KV; entries: KvEntry[] }> {
  const { kvm, jsm, bucket, settings, what } = options;
  const step: Step = options.step ?? ((_name, call) => call());
  const opened = await step(`${what}_bucket`, () => openBucket(kvm, jsm, bucket, settings));
  const entries = await step(`${what}_values`, () => latestEntries(opened.reader, opened.keys));
  return { kv: opened.kv, entries: entries.filter((entry): entry is KvEntry => entry !== null) };
}
