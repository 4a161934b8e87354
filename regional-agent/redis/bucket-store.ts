import calculateSlot from 'cluster-key-slot';
import { Cluster, type Redis, type Result } from 'ioredis';
import type { BucketStore } from '../../core/buckets/bucket-store.js';
import {
  MAX_REQUESTS_PER_CALL,
  decodeReply,
  encodeRequest,
  parseReplies,
  scriptCall,
  type DecideRequest,
  type Decision,
} from '../../core/wire/bucket.js';
import { DeadlinePassedError } from '../../core/wire/script.js';
import { idempotencyIndexKey } from '../../core/keys.js';
import type { EncodedReply, EncodedRequest } from '../../core/models/token-bucket.js';
import { CallerDeadlineError, type DecideOptions } from '../decisions/decision-store.js';
import { agentMicros, type RedisClock } from './redis-clock.js';
import { DEFAULT_STORE_TIMEOUT_MS } from '../config.js';
import { defineScript, runScript } from './scripts.js';

declare module 'ioredis' {
  interface RedisCommander<Context> {
    /** `lua/token_bucket.lua`: first argument is the number of keys, then keys, then ARGV. */
    qpTokenBucket(numKeys: number, ...keysAndArgs: string[]): Result<unknown, Context>;
  }
}

/** A layered check whose keys hash to different cluster slots: one script cannot decide it. */
export class CrossSlotError extends Error {
  readonly code = 'QP_CROSS_SLOT';
  readonly slots: readonly number[];
  constructor(slots: readonly number[]) {
    super(`keys of one script call span cluster slots ${slots.join(', ')}; split the call per subject`);
    this.name = 'CrossSlotError';
    this.slots = slots;
  }
}

/** Most requests per script call, by default. */
export const DEFAULT_MAX_BATCH = 64;
/** Most script calls of one slot on the wire at once, by default. */
export const DEFAULT_CALLS_IN_FLIGHT = 4;

export interface RedisBucketStoreOptions {
  /**
   * Coalesce the requests that arrive in one event-loop turn (per cluster slot) into one script call, up to
   * `maxBatch` requests. Each request is still decided all-or-nothing on its own, in arrival order; the batch
   * only saves round trips and per-call script overhead. Default true.
   */
  batch?: boolean;
  /** Most requests per script call, 1..256. Default DEFAULT_MAX_BATCH. */
  maxBatch?: number;
  /**
   * Most script calls of one slot on the wire at once (batching on); further requests wait in this process and
   * leave in the next call, so a burst makes bigger calls rather than a deep queue inside Redis, and a call's
   * time on the wire stays its own work. Default DEFAULT_CALLS_IN_FLIGHT.
   */
  callsInFlight?: number;
  /**
   * A call whose reply has not arrived this long after its write fails with WireTimeoutError (time queued in
   * this process never counts), and the script refuses to run it later than that. Default DEFAULT_STORE_TIMEOUT_MS.
   */
  timeoutMs?: number;
  /** Converts the call's deadline to Redis time; without one, calls carry no deadline into the script. */
  clock?: RedisClock | undefined;
  /** Most live idempotency records per subject, for requests that do not say. Default 1000. */
  idempotencyMaxRecords?: number;
}

interface Waiting {
  request: EncodedRequest;
  /** The caller's deadline, agent µs (agentMicros); undefined: only the store timeout bounds the call. */
  chargeBy: number | undefined;
  /** `rider`: the answer came in a script call that carried an earlier request of the batch too. */
  resolve: (reply: EncodedReply, rider: boolean) => void;
  reject: (error: unknown) => void;
}

/**
 * Decisions that rode in a script call with an earlier one of their batch: the call is the store's unit of
 * health, so the store breaker counts its success once (regional-agent/resilience/store-guard.ts). A failed call
 * rejects each of its requests with the same error object, which the breaker counts once in the same way.
 */
const riders = new WeakSet<object>();

/** Mark `value` as the answer of a script call whose success an earlier request of its batch already told. */
export function rideAlong<T extends object>(value: T): T {
  riders.add(value);
  return value;
}

/** Whether `decision` came in a script call whose success was already told by an earlier request of its batch. */
export function rodeAlong(decision: unknown): boolean {
  return typeof decision === 'object' && decision !== null && riders.has(decision);
}

/**
 * Token buckets on one Redis or one Redis Cluster, decided by `lua/token_bucket.lua`. The script is registered
 * with `defineCommand`, so ioredis sends EVALSHA and falls back to EVAL when the server lost its script cache.
 */
export class RedisBucketStore implements BucketStore {
  readonly redis: Redis | Cluster;
  readonly #cluster: boolean;
  readonly #batch: boolean;
  readonly #maxBatch: number;
  readonly #timeoutMs: number;
  readonly #command: string;
  readonly #clock: RedisClock | undefined;
  readonly #callsInFlight: number;
  readonly #maxRecords: number | undefined;
  /** Requests waiting to be sent and script calls on the wire, by cluster slot (0 on a single Redis). */
  readonly #lanes = new Map<number, { waiting: Waiting[]; onTheWire: number }>();
  /** Slots with requests that arrived since the last flush. */
  #arrived = new Set<number>();
  #flushScheduled = false;

  constructor(redis: Redis | Cluster, options: RedisBucketStoreOptions = {}) {
    this.redis = redis;
    this.#cluster = redis instanceof Cluster;
    this.#batch = options.batch ?? true;
    this.#maxBatch = options.maxBatch ?? DEFAULT_MAX_BATCH;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS;
    this.#clock = options.clock;
    this.#callsInFlight = options.callsInFlight ?? DEFAULT_CALLS_IN_FLIGHT;
    this.#maxRecords = options.idempotencyMaxRecords;
    if (!(Number.isInteger(this.#callsInFlight) && this.#callsInFlight >= 1)) {
      throw new RangeError('callsInFlight must be an integer >= 1');
    }
    if (!(
      Number.isInteger(this.#maxBatch) &&
      this.#maxBatch >= 1 &&
      this.#maxBatch <= MAX_REQUESTS_PER_CALL
    )) {
      throw new RangeError(`maxBatch must be an integer in [1, ${MAX_REQUESTS_PER_CALL}]`);
    }
    this.#command = defineScript(redis, 'token_bucket');
  }

  /**
   * The slot a key lives in on a cluster; 0 for every key on a single Redis, where any keys may share a script.
   * Callers group layered checks by this value.
   */
  slotOf(key: string): number {
    return this.#cluster ? calculateSlot(key) : 0;
  }

  async decide(request: DecideRequest, options: DecideOptions = {}): Promise<Decision> {
    const encoded = encodeRequest(request);
    if (encoded.idempotency !== undefined && encoded.idempotency.maxRecords === undefined) {
      encoded.idempotency = { ...encoded.idempotency, maxRecords: this.#maxRecords };
    }
    const slot = this.#cluster ? this.#oneSlot(encoded) : 0;
    const chargeBy = options.chargeBy === undefined ? undefined : Math.floor(options.chargeBy * 1000);
    if (!this.#batch) return decodeReply((await this.#call([encoded], chargeBy))[0]!);
    let rider = false;
    const reply = await new Promise<EncodedReply>((resolve, reject) => {
      let lane = this.#lanes.get(slot);
      if (lane === undefined) this.#lanes.set(slot, (lane = { waiting: [], onTheWire: 0 }));
      const answered = (r: EncodedReply, rode: boolean) => {
        rider = rode;
        resolve(r);
      };
      lane.waiting.push({ request: encoded, chargeBy, resolve: answered, reject });
      this.#arrived.add(slot);
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        setImmediate(this.#flush);
      }
    });
    const decision = decodeReply(reply);
    if (rider) riders.add(decision);
    return decision;
  }

  /** Send what arrived in this event-loop turn, as far as each slot's calls on the wire allow. */
  readonly #flush = (): void => {
    this.#flushScheduled = false;
    const arrived = this.#arrived;
    this.#arrived = new Set();
    for (const slot of arrived) this.#send(slot);
  };

  /**
   * Start calls for `slot` while it has requests waiting and room on the wire. A call holds requests of one
   * kind: those with a caller's deadline (which the call then carries) or those without, so a request close to
   * its caller's deadline never makes the script refuse another's.
   */
  #send(slot: number): void {
    const lane = this.#lanes.get(slot);
    if (lane === undefined) return;
    while (lane.waiting.length > 0 && lane.onTheWire < this.#callsInFlight) {
      const timed = lane.waiting[0]!.chargeBy !== undefined;
      const chunk: Waiting[] = [];
      const rest: Waiting[] = [];
      for (const w of lane.waiting) {
        if (chunk.length < this.#maxBatch && (w.chargeBy !== undefined) === timed) chunk.push(w);
        else rest.push(w);
      }
      lane.waiting = rest;
      const now = agentMicros();
      const live = chunk.filter((w) => {
        if (w.chargeBy === undefined || w.chargeBy > now) return true;
        w.reject(new CallerDeadlineError());
        return false;
      });
      if (live.length === 0) continue;
      const chargeBy = timed ? Math.min(...live.map((w) => w.chargeBy!)) : undefined;
      lane.onTheWire++;
      this.#call(
        live.map((w) => w.request),
        chargeBy,
      )
        .then(
          (replies) => live.forEach((w, i) => w.resolve(replies[i]!, i > 0)),
          (error: unknown) => live.forEach((w) => w.reject(error)),
        )
        .finally(() => {
          lane.onTheWire--;
          if (lane.waiting.length > 0) this.#send(slot);
          else if (lane.onTheWire === 0) this.#lanes.delete(slot);
        });
    }
  }

  /** One script call, written now; `chargeBy` (agent µs) is its callers' deadline, when earlier than the timeout. */
  async #call(requests: readonly EncodedRequest[], chargeBy?: number): Promise<EncodedReply[]> {
    const timeout = agentMicros() + this.#timeoutMs * 1000;
    const callersFirst = chargeBy !== undefined && chargeBy < timeout;
    if (chargeBy !== undefined && chargeBy <= agentMicros()) throw new CallerDeadlineError();
    const deadline = this.#clock?.toRedisMicros(callersFirst ? chargeBy : timeout) ?? 0;
    const { keys, argv } = scriptCall(requests, deadline);
    const reply = await runScript(
      this.redis,
      this.#command,
      keys,
      argv,
      this.#timeoutMs,
      'token bucket script',
    );
    try {
      return parseReplies(
        reply,
        requests.map((r) => r.checks.length),
      );
    } catch (error) {
      // Refused for the callers' own deadline (not the store timeout): their budget ran out, not the store.
      if (error instanceof DeadlinePassedError && callersFirst) throw new CallerDeadlineError();
      throw error;
    }
  }

  #oneSlot(request: EncodedRequest): number {
    const keys =
      request.idempotency === undefined
        ? request.keys
        : [...request.keys, request.idempotency.key, idempotencyIndexKey(request.idempotency.key)];
    const first = calculateSlot(keys[0]!);
    for (let i = 1; i < keys.length; i++) {
      if (calculateSlot(keys[i]!) !== first)
        throw new CrossSlotError([...new Set(keys.map((k) => calculateSlot(k)))]);
    }
    return first;
  }
}
