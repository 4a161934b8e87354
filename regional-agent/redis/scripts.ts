import { readFileSync } from 'node:fs';

/** Directory of the Lua scripts, resolved from this module so it works from any working directory. */
const LUA_DIR = new URL('../../lua/', import.meta.url);

const cache = new Map<string, string>();

/** Source of `lua/<name>.lua`, read once. */
export function luaSource(name: string): string {
  let source = cache.get(name);
  if (source === undefined) {
    source = readFileSync(new URL(`${name}.lua`, LUA_DIR), 'utf8');
    cache.set(name, source);
  }
  return source;
}
