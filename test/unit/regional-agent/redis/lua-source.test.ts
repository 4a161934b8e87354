/**
 * The scripts as Redis receives them: `luaSource` expands each `-- @include` line, so every script carries the
 * prelude once (its aliases, the clock block the test build swaps, the argument checks) and no include line, and
 * each shared rule (lua/include/) is written in one file only: a script that needs it includes it.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { luaSource } from '../../../../regional-agent/redis/scripts.js';
import { withClockArg } from '../../../helpers/lua-test-build.js';

const LUA = new URL('../../../../lua/', import.meta.url);
const scripts = readdirSync(LUA)
  .filter((f) => f.endsWith('.lua'))
  .map((f) => f.slice(0, -'.lua'.length));
const prelude = readFileSync(new URL('include/prelude.lua', LUA), 'utf8').trimEnd();

const count = (text: string, part: string) => text.split(part).length - 1;

/** A line of each shared rule (lua/include/), and the scripts that include it. */
const shared = {
  refill: {
    line: 'local gained = max(0, now - ts) * r + tonumber(h[2])',
    scripts: ['credit', 'grant', 'lend', 'token_bucket'],
  },
  take: {
    line: "call('HSET', key, 'tk', remaining, 'fr', carry, 'ts', ts, 'rt', rate, 'cp', cap)",
    scripts: ['grant', 'lend'],
  },
  idempotency: {
    line: 'if not (bar and string.sub(record, 1, bar - 1) == fingerprint) then return false end',
    scripts: ['daily_budget', 'sliding_log', 'token_bucket'],
  },
  args: {
    line: "if not int(fc, 0) then return nil, fail('floor capacity must be an integer >= 0') end",
    scripts: ['credit', 'daily_budget', 'grant', 'lend', 'sliding_log', 'subject_creation'],
  },
} as const;

describe('luaSource', () => {
  it('finds the thirteen scripts', () => {
    expect(scripts).toHaveLength(13);
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

  for (const [part, { line, scripts: users }] of Object.entries(shared)) {
    it(`${part}: written once in lua/include/${part}.lua, expanded once in each script that includes it`, () => {
      expect(count(readFileSync(new URL(`include/${part}.lua`, LUA), 'utf8'), line)).toBe(1);
      const including = scripts.filter((name) =>
        readFileSync(new URL(`${name}.lua`, LUA), 'utf8').includes(`-- @include ${part}\n`),
      );
      expect(including).toEqual([...users]);
      for (const name of scripts) {
        expect(count(readFileSync(new URL(`${name}.lua`, LUA), 'utf8'), line)).toBe(0);
        expect(count(luaSource(name), line)).toBe(including.includes(name) ? 1 : 0);
      }
    });
  }
});
