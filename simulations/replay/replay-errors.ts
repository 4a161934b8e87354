/** A replay that could not run against the stack (it did not start, an API refused, it died): CLI exit 1. */
export class ReplayError extends Error {
  readonly code = 'SIM_ERR_REPLAY';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ReplayError';
  }
}

/** The replay was stopped by a signal (Ctrl-C): everything it started has been stopped. CLI exit 130. */
export class ReplayInterrupted extends Error {
  readonly code = 'SIM_ERR_INTERRUPTED';
  constructor(signal: string) {
    super(`${signal}: replay stopped`);
    this.name = 'ReplayInterrupted';
  }
}
