/**
 * The scripts as Redis receives them: `luaSource` expands each `-- @include` line, so every script carries the
 * prelude once (its aliases, the clock block the test build swaps, the argument checks) and no include line.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { luaSource } from '../../regional-agent/redis/scripts.js';
import { withClockArg } from '../helpers/lua-test-build.js';

const LUA = new URL('../../lua/', import.meta.url);
const scripts = readdirSync(LUA)
  .filter((f) => f.endsWith('.lua'))
  .map((f) => f.slice(0, -'.lua'.length));
const prelude = readFileSync(new URL('include/prelude.lua', LUA), 'utf8').trimEnd();

const count = (text: string, part: string) => text.split(part).length - 1;

describe('luaSource', () => {
  it('finds the twelve scripts', () => {
    expect(scripts).toHaveLength(12);
  });

  for (const name of scripts) {
    it(`${name}: the prelude once, expanded; a script that reads the clock has a test build that swaps it`, () => {
      const file = readFileSync(new URL(`${name}.lua`, LUA), 'utf8');
      expect(count(file, '-- @include prelude\n')).toBe(1);
      const source = luaSource(name);
      expect(source).not.toMatch(/^-- @include/m);
      expect(count(source, prelude)).toBe(1);
      expect(count(source, '-- @clock-begin')).toBe(1);
      expect(source).toContain("call('TIME')");
      // Only a script that reads the clock has a test build (the refunds check #ARGV and read no clock).
      if (!/\bclock\(\)/.test(file)) return;
      expect(withClockArg(name)).toContain('local function clock() return tonumber(ARGV[#ARGV]) end');
      expect(withClockArg(name)).not.toContain("call('TIME')");
    });
  }
});
