import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { ownRecord } from '../../core/own-keys.js';
import { PolicyName, PolicySpec, type Policy } from '../../core/policy/policy.js';
import type { PolicySource } from './policy-source.js';

/** The policies file: `{ "policies": { "<name>": { …policy body… } } }`. */
export const PoliciesFile = z.strictObject({
  policies: ownRecord(PolicyName, z.unknown()),
});

/** The file could not be read or holds invalid policies; `problems` lists every one. */
export class PolicyFileError extends Error {
  readonly code = 'AGT_POLICIES_INVALID';
  readonly problems: readonly string[];
  constructor(path: string, problems: readonly string[]) {
    super(`policies file ${path} is invalid:\n  - ${problems.join('\n  - ')}`);
    this.name = 'PolicyFileError';
    this.problems = problems;
  }
}

/** Parse the text of a policies file; throws PolicyFileError listing every problem of every policy. */
export function parsePoliciesFile(path: string, text: string): ReadonlyMap<string, Policy> {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new PolicyFileError(path, [`not JSON: ${(error as Error).message}`]);
  }
  const file = PoliciesFile.safeParse(json);
  if (!file.success) {
    throw new PolicyFileError(
      path,
      file.error.issues.map((i) => `${i.path.join('.') || 'file'}: ${i.message}`),
    );
  }
  const problems: string[] = [];
  const out = new Map<string, Policy>();
  for (const [name, body] of Object.entries(file.data.policies)) {
    const spec = PolicySpec.safeParse(body);
    if (!spec.success) {
      for (const i of spec.error.issues) problems.push(`policies.${name}.${i.path.join('.')}: ${i.message}`);
    } else {
      out.set(name, Object.freeze({ ...spec.data, name }));
    }
  }
  if (problems.length > 0) throw new PolicyFileError(path, problems);
  return out;
}

export interface FilePolicySourceOptions {
  /** Reload when the file changes (debounced). SIGHUP reloads are wired by main.ts through `reload()`. */
  watch?: boolean;
  /** Told about a reload that failed; the last good set stays in force. */
  onReloadError?: (error: Error) => void;
}

/**
 * Policies from a JSON file, validated with the same schema the coordinator uses. A reload that fails keeps
 * the last good set in force (an operator typo must not drop every policy) and reports the error.
 */
export class FilePolicySource implements PolicySource {
  readonly path: string;
  #policies: ReadonlyMap<string, Policy> = new Map();
  readonly #listeners = new Set<(policies: ReadonlyMap<string, Policy>) => void>();
  readonly #options: FilePolicySourceOptions;
  #watcher: FSWatcher | undefined;
  #debounce: NodeJS.Timeout | undefined;
  #loaded: Promise<void> | undefined;
  #closed = false;

  constructor(path: string, options: FilePolicySourceOptions = {}) {
    this.path = path;
    this.#options = options;
  }

  current(): ReadonlyMap<string, Policy> {
    return this.#policies;
  }

  ready(): Promise<void> {
    this.#loaded ??= this.reload().then(() => {
      if (this.#options.watch === true) this.#watch();
    });
    return this.#loaded;
  }

  /** Read the file again; on success notify listeners, on failure keep the last good set and reject. */
  async reload(): Promise<void> {
    const text = await readFile(this.path, 'utf8').catch((error: unknown) => {
      throw new PolicyFileError(this.path, [`cannot read: ${(error as Error).message}`]);
    });
    this.#policies = parsePoliciesFile(this.path, text);
    for (const listener of this.#listeners) listener(this.#policies);
  }

  onChange(listener: (policies: ReadonlyMap<string, Policy>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  close(): Promise<void> {
    this.#closed = true;
    this.#watcher?.close();
    this.#watcher = undefined;
    clearTimeout(this.#debounce);
    this.#listeners.clear();
    return Promise.resolve();
  }

  #watch(): void {
    // Editors replace files (rename) as often as they write them: watch, debounce, and re-read the path.
    this.#watcher = watch(this.path, { persistent: false }, () => {
      clearTimeout(this.#debounce);
      this.#debounce = setTimeout(() => {
        // A replaced file is a new inode: watch the path afresh.
        if (this.#closed) return;
        this.#watcher?.close();
        this.#watch();
        this.reload().catch((error: unknown) => this.#options.onReloadError?.(error as Error));
      }, 50);
    });
    this.#watcher.on('error', (error) => this.#options.onReloadError?.(error));
  }
}
