/**
 * Replicas of the coordinator's JetStream state (`QP_KV_REPLICAS`): buckets and the audit stream are created with
 * them, and a stream created earlier with fewer (or more) is scaled to them at start, so raising the setting on a
 * running deployment takes effect at the next coordinator start. Three replicas on three regions' servers keep the
 * state readable and writable while any one region is cut off.
 */
import type { JetStreamManager } from '@nats-io/jetstream';

/** Set the stream's replica count to `replicas` when it differs. */
export async function ensureReplicas(jsm: JetStreamManager, stream: string, replicas: number): Promise<void> {
  const info = await jsm.streams.info(stream);
  if (info.config.num_replicas === replicas) return;
  await jsm.streams.update(stream, { ...info.config, num_replicas: replicas });
}
