/**
 * Writes the environment-variable tables of the docs from the configuration schemas: each row's name and
 * default from the schema (`AgentConfig`, `CoordinatorEnv`, the local stack's `StackEnv`), its meaning from the
 * variable map beside it (`regional-agent/config-docs.ts`, `coordinator/config-docs.ts`,
 * `scripts/stack/config-docs.ts`). A table sits between two marker comments,
 * `<!-- env-table:<id> begin … -->` and `<!-- env-table:<id> end -->`; nothing else in the page is touched.
 *
 *   npm run docs:env              rewrite the tables
 *   npm run docs:env -- --check   say which are stale and exit 1 (test/unit/scripts/docs-env-tables.test.ts does too)
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as prettier from 'prettier';
import type { z } from 'zod';
import { CoordinatorEnv } from '../coordinator/config.js';
import { COORDINATOR_VARIABLES } from '../coordinator/config-docs.js';
import type { VariableDoc } from '../core/config/env-config.js';
import { AgentConfig, envName } from '../regional-agent/config.js';
import { AGENT_VARIABLES } from '../regional-agent/config-docs.js';
import { StackEnv } from './stack/config.js';
import { STACK_VARIABLES } from './stack/config-docs.js';

const root = new URL('../', import.meta.url);

export interface EnvRow {
  name: string;
  /** The variable's schema; none for a variable read outside it (then its default is `unset`). */
  schema: z.ZodType | undefined;
  doc: VariableDoc;
}

export interface EnvTable {
  /** The page, from the repository's root. */
  file: string;
  /** The marker's id: `<!-- env-table:<id> begin -->`. */
  id: string;
  /** Where the names and defaults come from, said in the begin marker. */
  source: string;
  rows: readonly EnvRow[];
}

function rowsOf(
  variables: Readonly<Record<string, VariableDoc>>,
  shape: Readonly<Record<string, unknown>>,
  nameOf: (field: string) => string,
): EnvRow[] {
  return Object.entries(variables).map(([field, doc]) => ({
    name: nameOf(field),
    schema: Object.hasOwn(shape, field) ? (shape[field] as z.ZodType) : undefined,
    doc,
  }));
}

/** Every generated table. */
export function envTables(): EnvTable[] {
  const agent = rowsOf(AGENT_VARIABLES, AgentConfig.shape, envName);
  const coordinator = rowsOf(COORDINATOR_VARIABLES, CoordinatorEnv.shape, (name) => name);
  const stack = rowsOf(STACK_VARIABLES, StackEnv.shape, (name) => name);
  return [
    { file: 'docs/agent.md', id: 'agent', source: 'regional-agent/config.ts', rows: agent },
    {
      file: 'docs/coordinator.md',
      id: 'coordinator',
      source: 'coordinator/config.ts',
      rows: coordinator.filter((r) => r.doc.page === undefined),
    },
    {
      file: 'docs/protocol.md',
      id: 'coordinator-protocol',
      source: 'coordinator/config.ts',
      rows: coordinator.filter((r) => r.doc.page === 'protocol'),
    },
    { file: 'docs/running.md', id: 'stack', source: 'scripts/stack/config.ts', rows: stack },
  ];
}

/** What the schema parses for an unset variable, as text; undefined when it parses none (or refuses). */
export function schemaDefault(schema: z.ZodType): string | undefined {
  const parsed = schema.safeParse(undefined);
  if (!parsed.success) return undefined;
  const v: unknown = parsed.data;
  if (v === undefined) return undefined;
  if (Array.isArray(v)) return v.length === 0 ? undefined : v.join(',');
  if (v instanceof Map) return v.size === 0 ? undefined : JSON.stringify([...(v as Map<unknown, unknown>)]);
  if (typeof v === 'object' && v !== null) return Object.keys(v).length === 0 ? undefined : JSON.stringify(v);
  return typeof v === 'string' ? v : JSON.stringify(v);
}

/** The default cell: the schema's value (with its note), or the words for none. Throws when they disagree. */
export function defaultCell(row: EnvRow): string {
  const value = row.schema === undefined ? undefined : schemaDefault(row.schema);
  if (value === undefined) {
    if (row.doc.note !== undefined)
      throw new Error(`${row.name}: a note on a default the schema does not have`);
    return row.doc.unset ?? 'none';
  }
  if (row.doc.unset !== undefined)
    throw new Error(`${row.name}: documented "${row.doc.unset}", the schema defaults to ${value}`);
  return `\`${value}\`${row.doc.note === undefined ? '' : ` (${row.doc.note})`}`;
}

/** The table, as prettier formats it. */
export async function renderTable(table: EnvTable): Promise<string> {
  const lines = [
    '| variable | default | meaning |',
    '| --- | --- | --- |',
    ...table.rows.map((r) => `| \`${r.name}\` | ${defaultCell(r)} | ${r.doc.meaning} |`),
  ];
  const options = (await prettier.resolveConfig(fileURLToPath(new URL(table.file, root)))) ?? {};
  return (await prettier.format(lines.join('\n') + '\n', { ...options, parser: 'markdown' })).trimEnd();
}

const begin = (id: string) => `<!-- env-table:${id} begin`;
const end = (id: string) => `<!-- env-table:${id} end -->`;

/** The text between a table's markers (without them), or undefined when the page has no such markers. */
export function tableBlock(text: string, id: string): string | undefined {
  const from = text.indexOf(begin(id));
  const to = text.indexOf(end(id));
  if (from < 0 || to < from) return undefined;
  const afterBegin = text.indexOf('-->', from) + 3;
  return text.slice(afterBegin, to).trim();
}

/** `text` with the table between its markers replaced by `rendered`. */
export function withTable(text: string, table: EnvTable, rendered: string): string {
  const from = text.indexOf(begin(table.id));
  const to = text.indexOf(end(table.id));
  if (from < 0 || to < from)
    throw new Error(`${table.file}: no ${begin(table.id)} … ${end(table.id)} markers`);
  const marker = `${begin(table.id)}: generated by \`npm run docs:env\` from ${table.source} -->`;
  return `${text.slice(0, from)}${marker}\n\n${rendered}\n\n${text.slice(to)}`;
}

async function main(check: boolean): Promise<void> {
  const stale: string[] = [];
  for (const table of envTables()) {
    const url = new URL(table.file, root);
    const text = readFileSync(url, 'utf8');
    const next = withTable(text, table, await renderTable(table));
    if (next === text) continue;
    stale.push(`${table.file} (${table.id})`);
    if (!check) writeFileSync(url, next);
  }
  if (check && stale.length > 0) {
    process.stderr.write(`stale environment tables (run npm run docs:env): ${stale.join(', ')}\n`);
    process.exit(1);
  }
  process.stdout.write(
    stale.length === 0 ? 'environment tables are current\n' : `wrote ${stale.join(', ')}\n`,
  );
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  await main(process.argv.includes('--check'));
}
