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
 * coordinator forget it at its first heartbeat, so a starting agent sends that heartbeat only one term after it
 * starts (regional-agent/coordination.ts, `firstHeartbeatAfterMs`); with no successor the coordinator waits for
 * the lease, which no term outlives. Without a coordinator nothing acknowledges or says goodbye: closing clears
 * the timers and leaves nothing.
 */
import type { Gauge } from 'prom-client';

/** How long after its validity a term stays held, ms: timers fire late, never early, but clocks tick in whole ms. */
export const TERM_MARGIN_MS = 20;

export class TermHolds {
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #gauge: Gauge | undefined;
  readonly #waitOnClose: boolean;
  #idle: (() => void) | undefined;
  #closing = false;

  constructor(options: { gauge?: Gauge | undefined; waitOnClose: boolean }) {
    this.#gauge = options.gauge;
    this.#waitOnClose = options.waitOnClose;
  }

  /** Keep `leave` (a ShareView.enter's) uncalled for `ms`, then call it. */
  hold(leave: () => void, ms: number): void {
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#gauge?.set(this.#timers.size);
      leave();
      if (this.#timers.size === 0) this.#idle?.();
    }, ms);
    this.#timers.add(timer);
    this.#gauge?.set(this.#timers.size);
  }

  /** Terms (and the restart hold) not run out yet. */
  get held(): number {
    return this.#timers.size;
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
      for (const timer of this.#timers) clearTimeout(timer);
      this.#timers.clear();
      this.#gauge?.set(0);
    }
    if (this.#timers.size === 0) return Promise.resolve();
    return new Promise((resolve) => (this.#idle = resolve));
  }
}
