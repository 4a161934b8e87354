/**
 * A JetStream KV bucket as the control plane sees it: the latest value per key with the bucket's revision
 * (one sequence per bucket, bumped by every put and delete), surviving coordinator crashes. Deletions leave a
 * tombstone, so a watcher that fell behind learns of them too.
 */

export interface KvEntry<V> {
  key: string;
  /** null for a deletion. */
  value: V | null;
  revision: number;
}

export class SimKv<V> {
  readonly #entries = new Map<string, KvEntry<V>>();
  #revision = 0;

  /** Put (or, with null, delete) `key`; returns the new revision. */
  put(key: string, value: V | null): number {
    const revision = ++this.#revision;
    // Re-inserted so the map stays in revision order.
    this.#entries.delete(key);
    this.#entries.set(key, { key, value, revision });
    return revision;
  }

  /** The bucket's latest revision (0 when nothing was ever written). */
  get revision(): number {
    return this.#revision;
  }

  /** Live entries in revision order (what a watcher starting now receives first). */
  live(): { key: string; value: V; revision: number }[] {
    const out: { key: string; value: V; revision: number }[] = [];
    for (const e of this.#entries.values()) if (e.value !== null) out.push({ ...e, value: e.value });
    return out;
  }

  /** Entries and tombstones written after `revision`, in revision order (what a watcher that fell behind gets). */
  since(revision: number): KvEntry<V>[] {
    const out: KvEntry<V>[] = [];
    for (const e of this.#entries.values()) if (e.revision > revision) out.push(e);
    return out;
  }
}
