/**
 * How long a restart waits for a predecessor's terms (docs/agent.md, "Terms across a restart").
 *
 * A successor under the same instance name makes the coordinator forget its predecessor at its first heartbeat,
 * and settle the region's pending shrinks, while the predecessor's terms may still be in use. So every term is
 * recorded before it is answered: the latest instant (Redis time) until which any term this instance gave may be
 * in use, one key per instance in the region's Redis (core/keys.ts termsUntilKey, lua/terms_until.lua), written
 * only upward. A starting agent with a coordinator reads its instance's key and sends its first heartbeat, and
 * acknowledges shrinks, only once Redis time has passed that instant: no wait when nothing is recorded (no term
 * given, or the last one long over), the longest a predecessor could have given (MAX_TERM_MS + margin) when the
 * key cannot be read.
 */
import { MAX_TERM_MS } from '../../core/wire/term.js';
import { TERM_MARGIN_MS } from './term-holds.js';

/** What the store keeps for one instance (lua/terms_until.lua), in µs of Redis time. */
export interface TermsUntilRecord {
  /** The instant recorded; 0: none (never written, or expired once it had passed). */
  untilMicros: number;
  /** Redis TIME when it was read. */
  nowMicros: number;
}

/** The instance's key in the region's Redis (regional-agent/redis/terms-until-store.ts). */
export interface TermsUntilStore {
  /** Raise the recorded instant to `untilMicros` (never lower it); resolves once Redis said so. */
  write(untilMicros: number): Promise<void>;
  /** The recorded instant and Redis time now. */
  read(): Promise<TermsUntilRecord>;
}

/**
 * Records the terms an agent gives before each is answered (term-issuer.ts). Requests that arrive while a write
 * is in flight share the next write, of the latest instant among them; an instant no later than one already
 * written needs none. A term waits for a write that covers it and that Redis acknowledged.
 */
export class TermsUntil {
  readonly #store: Pick<TermsUntilStore, 'write'>;
  /** The latest instant Redis acknowledged. */
  #written = 0;
  #inFlight: { until: number; done: Promise<void> } | undefined;
  #next: { until: number; done: Promise<void>; settle: (write: Promise<void>) => void } | undefined;

  constructor(store: Pick<TermsUntilStore, 'write'>) {
    this.#store = store;
  }

  /** Resolves once a record covering `untilMicros` is in Redis; rejects when the write that would cover it failed. */
  cover(untilMicros: number): Promise<void> {
    if (untilMicros <= this.#written) return Promise.resolve();
    const flying = this.#inFlight;
    if (flying === undefined) return this.#write(untilMicros);
    if (untilMicros <= flying.until) return flying.done;
    if (this.#next === undefined) {
      let settle!: (write: Promise<void>) => void;
      const done = new Promise<void>((resolve, reject) => {
        settle = (write) => void write.then(resolve, reject);
      });
      this.#next = { until: untilMicros, done, settle };
    } else if (untilMicros > this.#next.until) this.#next.until = untilMicros;
    return this.#next.done;
  }

  #write(until: number): Promise<void> {
    const done = Promise.resolve()
      .then(() => this.#store.write(until))
      .then(() => {
        if (until > this.#written) this.#written = until;
      });
    this.#inFlight = { until, done };
    const after = () => {
      this.#inFlight = undefined;
      const next = this.#next;
      this.#next = undefined;
      if (next !== undefined) next.settle(this.cover(next.until));
    };
    done.then(after, after);
    return done;
  }
}

/** How long after the read the successor waits, ms: Redis time passing the record, and the margin. */
export function waitForRecordMs(record: TermsUntilRecord): number {
  if (record.untilMicros <= 0 || record.untilMicros <= record.nowMicros) return 0;
  return Math.ceil((record.untilMicros - record.nowMicros) / 1000) + TERM_MARGIN_MS;
}

/**
 * The wait when the record cannot be read, ms: the longest term any predecessor could have given (whatever its
 * QP_TERM_MS), and its margin, from the failed read (after the predecessor stopped).
 */
export const UNREAD_WAIT_MS = MAX_TERM_MS + TERM_MARGIN_MS;

export interface PredecessorWaitOptions {
  store: Pick<TermsUntilStore, 'read'>;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
  /** Resolves after `ms`; tests pass a fake. Default: a timer that keeps the process alive. */
  sleep?: (ms: number) => Promise<void>;
  /** Told how long the wait is once it is known (tests). */
  onWait?: (ms: number) => void;
}

/**
 * Resolves once every term a predecessor under this instance name may have given has run out: at once when none
 * is recorded, after Redis time passed the recorded instant otherwise, MAX_TERM_MS and its margin after a failed
 * read. Never rejects.
 */
export async function predecessorTermsOver(options: PredecessorWaitOptions): Promise<void> {
  const { log } = options;
  let ms: number;
  try {
    const record = await options.store.read();
    ms = waitForRecordMs(record);
    if (ms > 0)
      log.info(
        { waitMs: ms, untilMicros: record.untilMicros },
        `waiting ${ms} ms for a predecessor's terms before the first heartbeat and acknowledgement`,
      );
  } catch (error) {
    ms = UNREAD_WAIT_MS;
    log.warn(
      { err: error, waitMs: ms },
      `could not read when a predecessor's terms run out; waiting the longest a term lasts (${ms} ms) before the first heartbeat and acknowledgement`,
    );
  }
  options.onWait?.(ms);
  if (ms > 0) await (options.sleep ?? ((t) => new Promise((r) => setTimeout(r, t))))(ms);
}
