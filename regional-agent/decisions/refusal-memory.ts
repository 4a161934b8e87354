/**
 * The last refusal of each (policy, subject) this agent answered, for `GET /v1/explain`: when, why, and what the
 * bucket held. Kept in process, in a BoundedLru of `QP_EXPLAIN_REFUSALS` entries (the least recently refused
 * subject is forgotten first), so the memory stays bounded and an agent restart forgets it.
 *
 * Subjects are kept as the decision path holds them: normalized, or HMAC-hashed when the agent has a secret, as
 * in its Redis keys. They never reach a metric or a log from here; the gauge counts entries only.
 */
import { Gauge, type Registry } from 'prom-client';
import type { LastRefusal } from '../../core/wire/agent.js';
import { BoundedLru } from '../../core/bounded-lru.js';

/** Between a policy name and a subject in a key: neither may hold it. */
const SEP = '\u0000';

export class RefusalMemory {
  readonly #lru: BoundedLru<LastRefusal>;

  constructor(maxEntries: number) {
    this.#lru = new BoundedLru(maxEntries);
  }

  /** Entries held, at most the configured bound. */
  get size(): number {
    return this.#lru.size;
  }

  /** Remember `refusal` as the last of (policy, subject), replacing the one before. */
  note(policy: string, subject: string, refusal: LastRefusal): void {
    this.#lru.set(policy + SEP + subject, refusal);
  }

  /** The last refusal remembered of (policy, subject) (subject normalized or hashed), or null. */
  last(policy: string, subject: string): LastRefusal | null {
    return this.#lru.get(policy + SEP + subject) ?? null;
  }
}

/** Count the entries `memory` holds in `registry`, read at each scrape (no subject in its labels). */
export function refusalMemoryGauge(registry: Registry, memory: RefusalMemory): void {
  new Gauge({
    name: 'quotaplane_explain_refusals',
    help: 'Subjects whose last refusal this agent remembers for GET /v1/explain (bounded by QP_EXPLAIN_REFUSALS).',
    registers: [registry],
    collect() {
      this.set(memory.size);
    },
  });
}
