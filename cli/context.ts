/**
 * What every CLI command runs with: where the coordinator is, the token, output mode, and the terminal.
 * Tokens and URLs come from flags first, then the environment (docs/cli.md has the table).
 */
import { AdminClient } from './admin-client.js';

/** Default admin API address: the local stack's coordinator (`npm start`). */
export const DEFAULT_URL = 'http://127.0.0.1:7100';
export const DEFAULT_TIMEOUT_MS = 10_000;

/**
 * The coordinator answered, and holds nothing by the name the command asked for (a policy with no allocation, a
 * region it does not have): exit status 1, as for a refusal. Not a UsageError: a request was sent.
 */
export class NotFoundError extends Error {}

/** A mistake in the command line: the message, then the command's usage; exit status 2. */
export class UsageError extends Error {
  readonly usage: string | undefined;
  constructor(message: string, usage?: string) {
    super(message);
    this.name = 'UsageError';
    this.usage = usage;
  }
}

export interface Io {
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly stdout: (text: string) => void;
  readonly stderr: (text: string) => void;
  /** Standard input, read whole (for `--file -`). */
  readonly stdin?: () => Promise<string>;
  readonly fetch?: typeof fetch;
  readonly now?: () => number;
  /** The repository root: `simulate` and `stack` run its scripts. */
  readonly root: string;
}

/** Flags every command takes. */
export interface GlobalFlags {
  readonly url?: string;
  readonly token?: string;
  readonly json: boolean;
  readonly timeoutMs?: number;
}

export class Context {
  readonly io: Io;
  readonly json: boolean;
  readonly #flags: GlobalFlags;
  #client: AdminClient | undefined;

  constructor(io: Io, flags: GlobalFlags) {
    this.io = io;
    this.json = flags.json;
    this.#flags = flags;
  }

  /** The admin API client (built on first use, so local commands need no token). */
  get client(): AdminClient {
    const env = this.io.env;
    return (this.#client ??= new AdminClient({
      url: this.#flags.url ?? nonEmpty(env['QUOTAPLANE_URL']) ?? DEFAULT_URL,
      token:
        this.#flags.token ??
        nonEmpty(env['QUOTAPLANE_TOKEN']) ??
        nonEmpty(env['QP_ADMIN_TOKEN']) ??
        nonEmpty(env['QP_READ_TOKEN']),
      timeoutMs: this.#flags.timeoutMs ?? DEFAULT_TIMEOUT_MS,
      ...(this.io.fetch !== undefined ? { fetch: this.io.fetch } : {}),
    }));
  }

  now(): number {
    return (this.io.now ?? Date.now)();
  }

  /** Print a line (or a block) to standard output. */
  say(text: string): void {
    this.io.stdout(text.endsWith('\n') ? text : `${text}\n`);
  }

  /** `--json`: the value, pretty-printed, for scripts. */
  printJson(value: unknown): void {
    this.say(JSON.stringify(value, null, 2));
  }
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === '' ? undefined : value;
}
