/** Output files of a run: written into one folder (created if missing), every path remembered in order. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

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
