/** Output files of a run: written into one folder (created if missing), every path remembered in order. */
import { mkdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SimConfigError } from '../errors.js';

export interface OutputFiles {
  put: (name: string, text: string) => void;
  /** Paths written so far. */
  readonly written: string[];
}

export function outputFiles(dir: string): OutputFiles {
  mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  return {
    put: (name, text) => {
      const path = join(dir, name);
      writeFileSync(path, text);
      written.push(path);
    },
    written,
  };
}

/**
 * Create the output folder before anything runs, so an `--out` that cannot be one (an existing file, a path
 * under a file, a folder without write permission) is refused up front with exit code 2, not a stack trace
 * once the whole run is done.
 */
export function prepareOutDir(dir: string): void {
  let file = false;
  try {
    file = statSync(dir, { throwIfNoEntry: false })?.isDirectory() === false;
    if (!file) mkdirSync(dir, { recursive: true });
  } catch (error) {
    throw new SimConfigError(`--out ${dir}: cannot create the output folder (${(error as Error).message})`);
  }
  if (file) throw new SimConfigError(`--out ${dir} is a file, not a folder`);
}
