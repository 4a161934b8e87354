/**
 * Timeouts measured on the wire: from the moment a command is written to the moment its reply arrives at the
 * socket, never the time a reply spends waiting for this process's own event loop to read it.
 *
 * A timer that fires does not decide at once: it defers the verdict to `setImmediate`, which runs after the
 * event loop's next poll phase. A reply that reached the socket before the timer fired is read in that poll
 * phase and settles the call first, however late the busy loop came round to it. Only a reply that truly had
 * not arrived (a frozen, dead or slow server) times out.
 */

/** A call whose reply did not arrive within its timeout, measured on the wire. */
export class WireTimeoutError extends Error {
  readonly code = 'QP_WIRE_TIMEOUT';
  readonly timeoutMs: number;
  constructor(what: string, timeoutMs: number) {
    super(`${what}: no reply within ${timeoutMs} ms of the write`);
    this.name = 'WireTimeoutError';
    this.timeoutMs = timeoutMs;
  }
}

/**
 * `promise` (a call written just now), or a WireTimeoutError when its reply has not arrived `timeoutMs` after
 * this call. The promise is always observed: a reply or error that comes after the timeout is dropped, never
 * an unhandled rejection.
 */
export function onTheWire<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      setImmediate(() => {
        if (settled) return;
        settled = true;
        reject(new WireTimeoutError(what, timeoutMs));
      });
    }, timeoutMs);
    promise.then(
      (value) => {
        clearTimeout(timer);
        if (settled) return;
        settled = true;
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        if (settled) return;
        settled = true;
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}
