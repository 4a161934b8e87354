import { Cluster, type Redis } from 'ioredis';

/** This process's clock in microseconds: monotonic (performance.now), on the epoch of its start. */
export function agentMicros(): number {
  return Math.floor((performance.timeOrigin + performance.now()) * 1000);
}

/**
 * A sample read more than this long after it was asked for, beyond the link's own round trip, is dropped, µs.
 * Its offset is early by up to its round trip: one read after a 200 ms stall of this event loop (common while a
 * process starts) would make every deadline 200 ms early and every call "too late". With no sample good enough
 * yet, calls carry no deadline.
 */
export const MAX_SAMPLE_ROUND_TRIP_US = 10_000;

/**
 * Round trips a node must have answered before its shortest one counts as the link's own (a Redis farther than
 * MAX_SAMPLE_ROUND_TRIP_US, in another zone or behind a slow network): one round trip alone cannot tell a far
 * Redis from a stalled event loop, the shortest of three read at least a second apart can.
 */
export const LINK_ROUND_TRIPS = 3;

export interface RedisClockOptions {
  /** How often Redis TIME is sampled. Default 1000 ms. */
  sampleEveryMs?: number;
  /** Samples kept per node. Default 10. */
  keep?: number;
}

/**
 * Converts this process's instants to Redis TIME, so a store call can carry its deadline into the script.
 *
 * Every sample is `TIME` read from Redis minus this process's clock when the reply was read: Redis read its
 * clock before we read ours, so each sample is at most the true offset, and the largest recent one is the
 * closest. A deadline converted with it can only come early, never late: a call the agent gave up on can never
 * run in Redis after the agent answered. On a cluster each master is sampled and the smallest of their
 * offsets serves every slot, for the same reason. Without a sample yet, `toRedisMicros` answers 0 (no
 * deadline), so such a call could still be charged after its caller gave up: the agent is not ready until
 * `synced` (regional-agent/start.ts), and only calls sent to it anyway meanwhile carry none. A sample whose round trip
 * was long is dropped (MAX_SAMPLE_ROUND_TRIP_US): it would make deadlines early by that much. Long is measured
 * from the link's own round trip, the shortest of a node's last `keep` (once it has LINK_ROUND_TRIPS): a Redis
 * 20 ms away gives samples early by about 20 ms, which its calls' own round trip already costs; dropping them all
 * left the agent unready for good (every round trip over the bound).
 */
export class RedisClock {
  readonly #redis: Redis | Cluster;
  readonly #keep: number;
  readonly #samples = new Map<string, number[]>();
  /** Each node's last `keep` round trips, µs, dropped samples' too: the shortest is the link's own. */
  readonly #roundTrips = new Map<string, number[]>();
  #offset: number | undefined;
  #newestOffset: number | undefined;
  #timer: NodeJS.Timeout | undefined;

  constructor(redis: Redis | Cluster, options: RedisClockOptions = {}) {
    this.#redis = redis;
    this.#keep = options.keep ?? 10;
    const every = options.sampleEveryMs ?? 1000;
    void this.sample();
    // The first sample above usually finds the client still connecting: take one as soon as it is ready, so
    // calls carry their deadline from the start instead of a second later.
    redis.once('ready', () => void this.sample());
    this.#timer = setInterval(() => void this.sample(), every);
    this.#timer.unref();
  }

  /** True once a sample gives the offset: from then on every call carries its deadline into the script. */
  get synced(): boolean {
    return this.#offset !== undefined;
  }

  /** Redis TIME in µs of an instant of this process (agentMicros); 0 when the offset is not known yet. */
  toRedisMicros(micros: number): number {
    return this.#offset === undefined ? 0 : Math.max(1, Math.floor(micros + this.#offset));
  }

  /** Sample every node once (also run on a timer). Failures are ignored: the next sample tries again. */
  async sample(): Promise<void> {
    const nodes: Redis[] = this.#redis instanceof Cluster ? this.#redis.nodes('master') : [this.#redis];
    await Promise.all(
      nodes.map(async (node) => {
        if (node.status !== 'ready') return;
        try {
          const asked = agentMicros();
          const [seconds, micros] = await node.time();
          const at = agentMicros();
          const name = `${node.options.host ?? ''}:${node.options.port ?? ''}`;
          if (at - asked > this.#longestRoundTrip(name, at - asked)) return;
          const sample = Number(seconds) * 1_000_000 + Number(micros) - at;
          const list = this.#samples.get(name) ?? [];
          list.push(sample);
          if (list.length > this.#keep) list.shift();
          this.#samples.set(name, list);
        } catch {
          // The node is down or frozen; its old samples stay until it answers again.
        }
      }),
    );
    let offset: number | undefined;
    let newest: number | undefined;
    for (const list of this.#samples.values()) {
      const best = Math.max(...list);
      offset = offset === undefined ? best : Math.min(offset, best);
      const last = list[list.length - 1]!;
      newest = newest === undefined ? last : Math.min(newest, last);
    }
    this.#offset = offset;
    this.#newestOffset = newest;
  }

  /** Record a node's round trip; the longest one a sample may take: the bound past the link's own. */
  #longestRoundTrip(name: string, roundTrip: number): number {
    const list = this.#roundTrips.get(name) ?? [];
    list.push(roundTrip);
    if (list.length > this.#keep) list.shift();
    this.#roundTrips.set(name, list);
    const link = list.length < LINK_ROUND_TRIPS ? 0 : Math.min(...list);
    return link + MAX_SAMPLE_ROUND_TRIP_US;
  }

  /** The farthest node's own round trip (the shortest of its recent ones), µs; undefined before the first. */
  get linkRoundTripUs(): number | undefined {
    let farthest: number | undefined;
    for (const list of this.#roundTrips.values()) farthest = Math.max(farthest ?? 0, Math.min(...list));
    return farthest;
  }

  /**
   * As `toRedisMicros`, by each node's newest sample only: a Redis clock stepped back (or a failover to a node whose
   * clock is behind) shows in the next sample, where the largest of ten would keep the old, later offset for up to
   * ten samples. Earlier by up to one sample's round trip (at most MAX_SAMPLE_ROUND_TRIP_US): for deadlines that
   * outlast a call, such as a direct-decision term's.
   */
  toRedisMicrosNewest(micros: number): number {
    return this.#newestOffset === undefined ? 0 : Math.max(1, Math.floor(micros + this.#newestOffset));
  }

  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
