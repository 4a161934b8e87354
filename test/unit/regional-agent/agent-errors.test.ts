import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { AGENT_CODES, AgentErrors } from '../../../regional-agent/errors.js';

const doc = readFileSync(new URL('../../../docs/errors.md', import.meta.url), 'utf8');
const section = /## Regional agent \(`AGT_ERR_\*`\)([\s\S]*?)\n## /.exec(doc)?.[1] ?? '';

describe('agent error codes', () => {
  it('are unique', () => {
    expect(new Set(AGENT_CODES).size).toBe(AGENT_CODES.length);
  });

  it('each appears exactly once in the agent table of docs/errors.md, with its status', () => {
    expect(section).not.toBe('');
    for (const [code, Err] of Object.entries(AgentErrors)) {
      const rows = section.split('\n').filter((line) => line.startsWith(`| \`${code}\``));
      expect(rows, code).toHaveLength(1);
      const cells = rows[0]!.split('|').map((c) => c.trim());
      expect(cells[2], code).toBe(String(new Err('x', 'y', 'z').statusCode));
    }
    for (const code of ['RATE_LIMITED', 'LIMITER_UNAVAILABLE']) {
      expect(
        section.split('\n').filter((line) => line.startsWith(`| \`${code}\``)),
        code,
      ).toHaveLength(1);
    }
  });

  it('documents no code the agent does not have', () => {
    const documented = [...section.matchAll(/^\| `([A-Z_]+)`/gm)].map((m) => m[1]);
    expect(documented.sort()).toEqual([...AGENT_CODES].sort());
  });
});
