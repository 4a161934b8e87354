/**
 * Command-line parsing on `node:util` parseArgs: each command names its own flags; the global ones (`--url`,
 * `--token`, `--json`, `--timeout-ms`, `--help`) are added to every command. Mistakes become UsageErrors.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError, type GlobalFlags } from './context.js';

type Options = NonNullable<ParseArgsConfig['options']>;

export const GLOBAL_OPTIONS = {
  url: { type: 'string' },
  token: { type: 'string' },
  json: { type: 'boolean' },
  'timeout-ms': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies Options;

export interface Parsed {
  readonly values: Record<string, string | boolean | undefined>;
  readonly positionals: readonly string[];
  readonly global: GlobalFlags;
  readonly help: boolean;
}

export function parseFlags(argv: readonly string[], options: Options, usage: string): Parsed {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      options: { ...GLOBAL_OPTIONS, ...options },
      allowPositionals: true,
      strict: true,
    });
  } catch (error) {
    throw new UsageError((error as Error).message.replace(/\. To specify a positional.*$/s, ''), usage);
  }
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const timeout = values['timeout-ms'];
  const global: GlobalFlags = {
    json: values['json'] === true,
    ...(typeof values['url'] === 'string' ? { url: values['url'] } : {}),
    ...(typeof values['token'] === 'string' ? { token: values['token'] } : {}),
    ...(typeof timeout === 'string' ? { timeoutMs: timeoutMs(timeout, usage) } : {}),
  };
  return { values, positionals: parsed.positionals, global, help: values['help'] === true };
}

/** A flag's value as a finite number, or a UsageError naming the flag. */
export function numberFlag(
  value: string | boolean | undefined,
  flag: string,
  usage: string,
): number | undefined {
  if (value === undefined) return undefined;
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : Number.NaN;
  if (!Number.isFinite(n)) throw new UsageError(`${flag} needs a number, got "${String(value)}"`, usage);
  return n;
}

/** Longest timer Node keeps (2^31 - 1 ms, about 24.8 days): a longer one fires at once. */
const MAX_TIMEOUT_MS = 2_147_483_647;

function timeoutMs(value: string, usage: string): number {
  const n = positiveInt(value, '--timeout-ms', usage);
  if (n > MAX_TIMEOUT_MS)
    throw new UsageError(`--timeout-ms needs a whole number ≤ ${MAX_TIMEOUT_MS}, got "${value}"`, usage);
  return n;
}

export function positiveInt(value: string, flag: string, usage: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0)
    throw new UsageError(`${flag} needs a whole number > 0, got "${value}"`, usage);
  return n;
}

export function stringFlag(value: string | boolean | undefined): string | undefined {
  return typeof value === 'string' ? value : undefined;
}

/** Exactly `count` positionals, named in the message when missing or extra. */
export function positionals(parsed: Parsed, names: readonly string[], usage: string): string[] {
  const got = parsed.positionals;
  if (got.length < names.length)
    throw new UsageError(`missing ${names.slice(got.length).join(' and ')}`, usage);
  if (got.length > names.length) throw new UsageError(`unexpected argument "${got[names.length]!}"`, usage);
  return [...got];
}
