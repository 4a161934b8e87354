/**
 * Configuration blocks the docs show and the tests run, so there is one copy of each: a block is the first
 * fenced code block after an HTML comment `<!-- NAME: … -->` in a file under docs/.
 */
import { readFileSync } from 'node:fs';

/** The text of the fenced block after the `<!-- name: … -->` marker in `docs/<file>`. */
export function docBlock(file: string, name: string): string {
  const path = new URL(`../../docs/${file}`, import.meta.url);
  const text = readFileSync(path, 'utf8');
  const marker = text.indexOf(`<!-- ${name}:`);
  if (marker < 0) throw new Error(`docs/${file} has no <!-- ${name}: … --> marker`);
  const open = /```[a-z]*\n/.exec(text.slice(marker));
  if (open === null) throw new Error(`docs/${file}: no code block after the ${name} marker`);
  const start = marker + open.index + open[0].length;
  const end = text.indexOf('\n```', start);
  if (end < 0) throw new Error(`docs/${file}: the ${name} block is not closed`);
  return text.slice(start, end + 1);
}

/** `block` with each `from` replaced by its `to`; throws when a `from` is not found (the docs changed). */
export function substitute(block: string, replacements: Readonly<Record<string, string>>): string {
  let out = block;
  for (const [from, to] of Object.entries(replacements)) {
    if (!out.includes(from))
      throw new Error(`the documented block no longer contains ${JSON.stringify(from)}`);
    out = out.split(from).join(to);
  }
  return out;
}
