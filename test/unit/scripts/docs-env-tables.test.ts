/**
 * The environment-variable tables of docs/agent.md, docs/coordinator.md, docs/protocol.md and docs/running.md
 * (the local stack) are what `npm run docs:env` (scripts/docs-env-tables.ts) generates from the schemas: every
 * variable a schema reads has its row, every row names a variable read, and every default is the one the schema
 * parses when the variable is unset. A stale table fails here, naming the page and the rows that differ.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CoordinatorEnv } from '../../../coordinator/config.js';
import { COORDINATOR_VARIABLES } from '../../../coordinator/config-docs.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import { AGENT_VARIABLES } from '../../../regional-agent/config-docs.js';
import {
  defaultCell,
  envTables,
  renderTable,
  tableBlock,
  withTable,
  type EnvRow,
} from '../../../scripts/docs-env-tables.js';
import { StackEnv } from '../../../scripts/stack/config.js';
import { PASS_THROUGH_VARIABLES, STACK_VARIABLES } from '../../../scripts/stack/config-docs.js';

const read = (file: string) => readFileSync(new URL(`../../../${file}`, import.meta.url), 'utf8');

/** Lines of `actual` that `expected` lacks and the reverse: what a stale table changed. */
function difference(actual: string, expected: string): string[] {
  const a = actual.split('\n');
  const e = expected.split('\n');
  return [
    ...a.filter((l) => !e.includes(l)).map((l) => `- ${l}`),
    ...e.filter((l) => !a.includes(l)).map((l) => `+ ${l}`),
  ];
}

describe('generated environment tables', () => {
  for (const table of envTables()) {
    it(`${table.file} (${table.id}) is what the schema generates`, async () => {
      const block = tableBlock(read(table.file), table.id);
      expect(block, `${table.file}: env-table:${table.id} markers`).toBeDefined();
      const generated = await renderTable(table);
      expect(difference(block!, generated), `${table.file}: run npm run docs:env`).toEqual([]);
      expect(block).toBe(generated);
    });
  }

  it('every variable a schema reads has a row, and every row is a variable read (or one loadConfig reads outside the schema)', () => {
    const sorted = (keys: Iterable<string>) => [...keys].sort();
    expect(sorted(Object.keys(AGENT_VARIABLES))).toEqual(sorted(Object.keys(AgentConfig.shape)));
    expect(sorted(Object.keys(COORDINATOR_VARIABLES))).toEqual(
      sorted([...Object.keys(CoordinatorEnv.shape), 'QP_ADMIN_TOKENS_FILE']),
    );
    expect(sorted(Object.keys(STACK_VARIABLES))).toEqual(
      sorted([...Object.keys(StackEnv.shape), ...PASS_THROUGH_VARIABLES]),
    );
    for (const table of envTables()) {
      const names = table.rows.map((r) => r.name);
      expect(new Set(names).size, `${table.file}: a variable twice`).toBe(names.length);
    }
    const rows = envTables().flatMap((t) => t.rows);
    expect(rows).toHaveLength(
      Object.keys(AGENT_VARIABLES).length +
        Object.keys(COORDINATOR_VARIABLES).length +
        Object.keys(STACK_VARIABLES).length,
    );
    expect(rows.filter((r) => r.schema === undefined).map((r) => r.name)).toEqual([
      'QP_ADMIN_TOKENS_FILE',
      ...PASS_THROUGH_VARIABLES,
    ]);
  });

  it('a default is the schema one: a value is shown, words for none are refused when the schema has one', () => {
    const storeTimeout: EnvRow = {
      name: 'QP_STORE_TIMEOUT_MS',
      schema: AgentConfig.shape.storeTimeoutMs,
      doc: { meaning: 'm' },
    };
    expect(defaultCell(storeTimeout)).toBe('`50`');
    expect(defaultCell({ ...storeTimeout, doc: { meaning: 'm', note: 'ms' } })).toBe('`50` (ms)');
    expect(() => defaultCell({ ...storeTimeout, doc: { meaning: 'm', unset: 'none' } })).toThrow(
      'QP_STORE_TIMEOUT_MS: documented "none", the schema defaults to 50',
    );
    const region: EnvRow = { name: 'QP_REGION', schema: AgentConfig.shape.region, doc: { meaning: 'm' } };
    expect(defaultCell(region)).toBe('none');
    expect(defaultCell({ ...region, doc: { meaning: 'm', unset: 'required' } })).toBe('required');
    expect(() => defaultCell({ ...region, doc: { meaning: 'm', note: 'off' } })).toThrow(
      'QP_REGION: a note on a default the schema does not have',
    );
  });

  it('a drifted row is found, and writing the table puts it back', async () => {
    const table = envTables().find((t) => t.id === 'agent')!;
    const page = read(table.file);
    const drifted = page.replace(/(\| `QP_STORE_TIMEOUT_MS` +\| )`50`/, '$1`60`');
    expect(drifted).not.toBe(page);
    const generated = await renderTable(table);
    expect(difference(tableBlock(drifted, table.id)!, generated)).toEqual([
      expect.stringMatching(/^- \| `QP_STORE_TIMEOUT_MS` +\| `60` /) as unknown,
      expect.stringMatching(/^\+ \| `QP_STORE_TIMEOUT_MS` +\| `50` /) as unknown,
    ]);
    expect(withTable(drifted, table, generated)).toBe(page);
  });
});
