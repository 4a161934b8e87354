/**
 * How a service turns its environment into configuration (agent, coordinator): one zod schema holds every
 * variable, its bounds and its default; every problem is reported at once, one line each, naming the variable;
 * the result is frozen. Pure: the caller reads the environment and any file.
 */
import type { z } from 'zod';

/** A problem a service finds itself: a rule across fields, or a file it could not read. */
export interface ConfigProblem {
  path: readonly PropertyKey[];
  message: string;
}

export interface EnvConfigOptions<S extends z.ZodType> {
  schema: S;
  /** The values to parse: the environment, or fields gathered from it (and a file). */
  input: unknown;
  /** Problems found before parsing (a file that could not be read), listed first. */
  problems?: readonly string[];
  /**
   * Rules across fields, checked on the raw input too: zod skips a schema's refinements when a field is invalid,
   * and these are listed anyway (once each).
   */
  crossField?: (input: Record<string, unknown>) => readonly ConfigProblem[];
  /** How a problem names where it is: the variable (and field) its path starts at. */
  where: (path: readonly PropertyKey[]) => string;
  /** The service's error for a list of problems (its code and heading). */
  fail: (problems: readonly string[]) => Error;
}

/** Parse `input` with `schema`, throwing `fail(problems)` listing every problem; the result is deeply frozen. */
export function loadEnvConfig<S extends z.ZodType>(options: EnvConfigOptions<S>): Readonly<z.output<S>> {
  const problems = [...(options.problems ?? [])];
  const parsed = options.schema.safeParse(options.input);
  if (!parsed.success) {
    const issues: ConfigProblem[] = [...parsed.error.issues];
    const raw = options.input;
    if (options.crossField !== undefined && typeof raw === 'object' && raw !== null) {
      for (const p of options.crossField(raw as Record<string, unknown>)) {
        if (!issues.some((i) => i.path[0] === p.path[0] && i.message === p.message)) issues.push(p);
      }
    }
    for (const issue of issues) problems.push(`${options.where(issue.path)}: ${issue.message}`);
  }
  if (problems.length > 0 || !parsed.success) throw options.fail(problems);
  return deepFreeze(parsed.data);
}

/** Freeze a value and everything it holds. */
export function deepFreeze<T>(value: T): Readonly<T> {
  if (typeof value === 'object' && value !== null) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

/**
 * What the docs say of one variable, beside what its schema holds: the generated tables of docs/*.md
 * (`npm run docs:env`) take the name and the default from the schema and these words from here.
 */
export interface VariableDoc {
  /** The table's meaning cell (markdown, one line). */
  meaning: string;
  /**
   * The default cell when the schema parses no value for an unset variable (`required`, `none (anonymous)`,
   * `` `QP_HOST` ``); default `none`. Given for a variable whose schema has a default, it is an error.
   */
  unset?: string;
  /** A remark after a default value: `` `0` (off) ``. */
  note?: string;
  /** The page of its table, when a service's variables are in more than one. */
  page?: string;
}
