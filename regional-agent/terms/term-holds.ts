/**
 * Terms held (docs/agent.md, "Terms"): a term is a decision that lasts, so the agent keeps it entered in its share
 * view (`ShareView.enter`) until the term has run out, and the lease holder acknowledges a shrink only once every
 * term given under an older record has lapsed. Each hold is one timer that leaves `validForMs` + TERM_MARGIN_MS
 * after the term was given.
 *
 * Closing never leaves early: an agent that left on close would acknowledge shrinks while clients still decide with
 * its terms. With a coordinator (`waitOnClose`), closing waits until every hold has run out, each leaving on its
 * own timer as it would have: the agent's goodbye, sent after this closes, makes the coordinator forget the agent
 * and settle its shrinks, which must not happen while a client may still decide with one of its terms. A close
 * cut short (the process killed) sends neither; a successor under the same instance name would make the
 * coordinator forget it at its first heartbeat, so every term is recorded in Redis before it is answered, and a
 * starting agent sends that heartbeat, and acknowledges anything, only once the recorded instant has passed
 * (regional-agent/terms/terms-until.ts; the restart hold, `holdUntil`); with no successor the coordinator waits
 * for the lease, which no term outlives. Without a coordinator nothing acknowledges or says goodbye: closing
 * clears the timers and leaves nothing.
 */
import type { Gauge } from 'prom-client';

/** How long after its validity a term stays held, ms: timers fire late, never early, but clocks tick in whole ms. */
export const TERM_MARGIN_MS = 20;

export class TermHolds {
  /** Each hold's way to end at once (its timer cleared, or its wait ignored), without leaving. */
  readonly #holds = new Set<() => void>();
  readonly #gauge: Gauge | undefined;
  readonly #waitOnClose: boolean;
  #idle: (() => void) | undefined;
  #closing = false;

  constructor(options: { gauge?: Gauge | undefined; waitOnClose: boolean }) {
    this.#gauge = options.gauge;
    this.#waitOnClose = options.waitOnClose;
  }

  /**
   * Keep `leave` (a ShareView.enter's) uncalled for `ms`, then call it. Returns a release that leaves at once: only
   * for a term never answered (its record in Redis failed), which no client can decide with.
   */
  hold(leave: () => void, ms: number): () => void {
    const timer = setTimeout(() => release(), ms);
    const stop = () => clearTimeout(timer);
    const release = this.#add(leave, stop);
    return release;
  }

  /** Keep `leave` uncalled until `over` settles (the restart hold: a predecessor's terms run out), then call it. */
  holdUntil(leave: () => void, over: Promise<unknown>): void {
    const release = this.#add(leave, () => undefined);
    over.then(release, release);
  }

  /** Count a hold in; the returned release (once) counts it out and calls `leave`. */
  #add(leave: () => void, stop: () => void): () => void {
    let done = false;
    const release = () => {
      if (done || !this.#holds.has(stop)) return;
      done = true;
      stop();
      this.#holds.delete(stop);
      this.#gauge?.set(this.#holds.size);
      leave();
      if (this.#holds.size === 0) this.#idle?.();
    };
    this.#holds.add(stop);
    this.#gauge?.set(this.#holds.size);
    return release;
  }

  /** Terms (and the restart hold) not run out yet. */
  get held(): number {
    return this.#holds.size;
  }

  /** True once `close` was called: give no more terms. */
  get closing(): boolean {
    return this.#closing;
  }

  /**
   * Give no more terms. With `waitOnClose`, resolves once every hold has run out (each left by its own timer,
   * never early); without, clears the timers at once and leaves nothing.
   */
  close(): Promise<void> {
    this.#closing = true;
    if (!this.#waitOnClose) {
      for (const stop of this.#holds) stop();
      this.#holds.clear();
      this.#gauge?.set(0);
    }
    if (this.#holds.size === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#idle = resolve));
  }
}
