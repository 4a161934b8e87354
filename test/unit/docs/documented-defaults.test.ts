/**
 * The configuration tables against the schemas that hold the defaults: README.md's summary of the agent's
 * variables, docs/running.md (the local stack), docs/cli.md and the simulator's: every default a table names is
 * the one the schema parses when the variable is unset, every variable a table names is read by its schema, and
 * every variable a schema reads is in its full table. A table whose default drifts from the code fails here,
 * naming the file, the variable and both values. The full tables of the agent, the coordinator and the local
 * stack are generated from their schemas (scripts/docs-env-tables.ts) and checked by
 * test/unit/scripts/docs-env-tables.test.ts; the stack's is read here too, as it was written by hand before.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { DEFAULT_TIMEOUT_MS, DEFAULT_URL } from '../../../cli/context.js';
import { CoordinatorEnv } from '../../../coordinator/config.js';
import { defaultRebalanceSettings } from '../../../core/rebalance/settings.js';
import { AgentConfig, envName } from '../../../regional-agent/config.js';
import { StackEnv } from '../../../scripts/stack/config.js';
import { DEFAULT_SECRETS_DIR } from '../../../scripts/stack/launcher.js';
import { ownValue } from '../../../core/own-keys.js';
import { DEFAULT_SETTINGS, describeSettings } from '../../../simulations/settings.js';
import { DEFAULT_STRATEGIES, parseCli } from '../../../simulations/cli-args.js';

const root = new URL('../../../', import.meta.url);
const read = (file: string) => readFileSync(new URL(file, root), 'utf8');

/** What a table says a variable's default is: a value, or none (unset, required, or derived elsewhere). */
type Documented = { kind: 'value'; text: string } | { kind: 'none'; text: string };

interface Row {
  file: string;
  name: string;
  documented: Documented;
  cell: string;
}

/** A default cell that names no value: unset, required, generated at start, or another variable's value. */
const NO_VALUE =
  /^(none|—|-|\(?required|one required|instead of|system cas|generated|from |a temporary|the kept|one generic rule|equal split)/i;

function classify(part: string): Documented {
  const text = part.trim();
  const bare = text.replace(/`/g, '').trim();
  // Words name no value (none, required); code (`none`) is a value.
  if (!text.startsWith('`') && NO_VALUE.test(bare)) return { kind: 'none', text };
  // A placeholder (`<host>:<port>`) or another variable (`QP_HOST`) is a default derived at start.
  if (bare.includes('<') || /^QP_[A-Z0-9_]+$/.test(bare)) return { kind: 'none', text };
  return { kind: 'value', text: bare };
}

/** The value part of a default cell: what precedes a parenthetical remark (`0` (off) is `0`). */
function leading(cell: string): string {
  const at = cell.indexOf(' (');
  return at > 0 ? cell.slice(0, at) : cell;
}

/**
 * Variable names of a name cell: backticked `QP_*` names; `…_EU_…` repeats the first name for another region;
 * `_FILE` extends the name before it; `A` … `B` is every variable of the schema from A to B.
 */
function namesOf(cell: string, schemaKeys: readonly string[]): string[] {
  const tokens = [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
  const range = /`([A-Z0-9_]+)` … `([A-Z0-9_]+)`/.exec(cell);
  if (range !== null) {
    const from = schemaKeys.indexOf(range[1]!);
    const to = schemaKeys.indexOf(range[2]!);
    if (from < 0 || to < from) return [range[1]!, range[2]!];
    return schemaKeys.slice(from, to + 1);
  }
  const names: string[] = [];
  for (const t of tokens) {
    const region = /^…_([A-Z]+)_…$/.exec(t);
    if (region !== null && names[0] !== undefined) {
      names.push(names[0].replace(/_(US|EU|AP)_/, `_${region[1]}_`));
    } else if (t.startsWith('_') && names.length > 0) {
      names.push(names[names.length - 1]! + t);
    } else if (/^[A-Z][A-Z0-9_]*$/.test(t)) {
      names.push(t);
    }
  }
  return names;
}

/**
 * Every row of the tables in `file` whose header has `nameColumn` and a `default` column. A cell naming several
 * variables gives its default to each, or one value each (`7101`, `7102`, `7103`; `127.0.0.1 / 7101`;
 * `7151`-`7156`).
 */
function tableRows(file: string, nameColumn: string, schemaKeys: readonly string[]): Row[] {
  const rows: Row[] = [];
  let columns: string[] | undefined;
  for (const line of read(file).split('\n')) {
    if (!line.startsWith('|')) {
      columns = undefined;
      continue;
    }
    const cells = line
      .replace(/\\\|/g, '¦')
      .split('|')
      .slice(1, -1)
      .map((c) => c.trim());
    if (columns === undefined) {
      columns = cells.includes(nameColumn) && cells.includes('default') ? cells : [];
      continue;
    }
    if (columns.length === 0 || /^-+:?$/.test(cells[0] ?? '')) continue;
    const nameCell = cells[columns.indexOf(nameColumn)] ?? '';
    const cell = cells[columns.indexOf('default')] ?? '';
    const names = namesOf(nameCell, schemaKeys);
    // Pass-through prefixes (`QP_AGENT_*`) and flags without a variable (docs/cli.md) have no default to check.
    if (names.length === 0 && (nameCell === '' || nameCell.includes('*`'))) continue;
    const value = leading(cell);
    const numbers = /^`?(\d+)`?-`?(\d+)`?$/.exec(value);
    let parts: string[];
    if (names.length > 1 && numbers !== null) {
      const first = Number(numbers[1]);
      parts = names.map((_, i) => String(first + i));
      expect(first + names.length - 1, `${file}: ${nameCell}`).toBe(Number(numbers[2]));
    } else if (names.length > 1) {
      parts = value.split(/\s*\/\s*|,\s+/);
      if (parts.length === 1) parts = names.map(() => value);
    } else parts = [value];
    expect(parts.length, `${file}: defaults of ${nameCell}`).toBe(names.length);
    names.forEach((name, i) => rows.push({ file, name, documented: classify(parts[i]!), cell }));
  }
  return rows;
}

/** What the schema parses for an unset variable: text to compare, or none (unset, empty, or required). */
function schemaDefault(field: z.ZodType): Documented {
  const parsed = field.safeParse(undefined);
  if (!parsed.success) return { kind: 'none', text: 'required' };
  const v: unknown = parsed.data;
  if (v === undefined) return { kind: 'none', text: 'undefined' };
  if (Array.isArray(v))
    return v.length === 0 ? { kind: 'none', text: '[]' } : { kind: 'value', text: v.join(',') };
  if (v instanceof Map)
    return v.size === 0
      ? { kind: 'none', text: 'Map{}' }
      : { kind: 'value', text: JSON.stringify([...(v as Map<unknown, unknown>)]) };
  if (typeof v === 'object' && v !== null)
    return Object.keys(v).length === 0
      ? { kind: 'none', text: '{}' }
      : { kind: 'value', text: JSON.stringify(v) };
  return { kind: 'value', text: typeof v === 'string' ? v : JSON.stringify(v) };
}

/** Defaults the schema leaves unset and the service fills at start from a constant of its own. */
const FILLED_AT_START: Readonly<Record<string, string>> = {
  QP_STACK_SECRETS_DIR: DEFAULT_SECRETS_DIR,
};

/** One service: its schema's fields by variable name, and the tables that document them. */
interface Service {
  name: string;
  fields: ReadonlyMap<string, z.ZodType>;
  /** Read outside the schema (by main.ts): documented, with no default. */
  alsoReads: readonly string[];
  /** Every variable must be in one of these (none: its full table is generated, docs-env-tables.test.ts). */
  tables: readonly string[];
  /** Tables that name some of the variables (a summary). */
  summaries: readonly string[];
}

const agentFields = new Map(
  Object.entries(AgentConfig.shape).map(([field, schema]) => [envName(field), schema as z.ZodType]),
);
const coordinatorFields = new Map(
  Object.entries(CoordinatorEnv.shape).map(([k, schema]) => [k, schema as z.ZodType]),
);
const stackFields = new Map(Object.entries(StackEnv.shape).map(([k, schema]) => [k, schema as z.ZodType]));

const SERVICES: readonly Service[] = [
  {
    name: 'agent (regional-agent/config.ts)',
    fields: agentFields,
    alsoReads: [],
    tables: [],
    summaries: ['README.md'],
  },
  {
    name: 'local stack (scripts/stack/config.ts)',
    fields: stackFields,
    alsoReads: [],
    tables: ['docs/running.md'],
    summaries: [],
  },
];

function check(service: Service, rows: readonly Row[]): string[] {
  const problems: string[] = [];
  for (const row of rows) {
    const where = `${row.file}: ${row.name}`;
    if (service.alsoReads.includes(row.name)) {
      if (row.documented.kind !== 'none')
        problems.push(`${where}: documented default ${row.cell}, none in code`);
      continue;
    }
    const field = service.fields.get(row.name);
    if (field === undefined) {
      problems.push(`${where}: not read by the ${service.name}`);
      continue;
    }
    const actual = schemaDefault(field);
    const doc = row.documented;
    if (doc.kind === 'none' && actual.kind === 'value') {
      problems.push(`${where}: documented "${row.cell}", the schema defaults to ${actual.text}`);
    } else if (doc.kind === 'value' && actual.kind === 'none') {
      if (ownValue(FILLED_AT_START, row.name) !== doc.text)
        problems.push(`${where}: documented ${doc.text}, the schema has no default (${actual.text})`);
    } else if (doc.kind === 'value' && actual.kind === 'value' && doc.text !== actual.text) {
      problems.push(`${where}: documented ${doc.text}, the schema defaults to ${actual.text}`);
    }
  }
  return problems;
}

describe('documented defaults', () => {
  for (const service of SERVICES) {
    describe(service.name, () => {
      const keys = [...service.fields.keys()];
      const rows = [...service.tables, ...service.summaries].flatMap((f) => tableRows(f, 'variable', keys));

      it('every documented default is the schema default, and every documented variable is read', () => {
        expect(rows.length).toBeGreaterThan(5);
        expect(check(service, rows)).toEqual([]);
      });

      // A service whose full table is generated has none here (docs-env-tables.test.ts checks it).
      if (service.tables.length > 0)
        it('every variable the schema reads is in its table', () => {
          const inTables = new Set(rows.filter((r) => service.tables.includes(r.file)).map((r) => r.name));
          const missing = [...keys, ...service.alsoReads].filter((k) => !inTables.has(k));
          expect(missing).toEqual([]);
        });
    });
  }

  it('the CLI table (docs/cli.md) names the CLI defaults', () => {
    const rows = tableRows('docs/cli.md', 'environment', []);
    expect(rows.map((r) => [r.name, r.documented])).toEqual([
      ['QUOTAPLANE_URL', { kind: 'value', text: DEFAULT_URL }],
      ['QUOTAPLANE_TOKEN', { kind: 'none', text: 'none' }],
      ['QP_ADMIN_TOKEN', { kind: 'none', text: 'none' }],
      ['QP_READ_TOKEN', { kind: 'none', text: 'none' }],
    ]);
    const table = read('docs/cli.md');
    expect(table).toMatch(new RegExp(`\\| \`--timeout-ms N\` +\\| +\\| ${DEFAULT_TIMEOUT_MS} +\\|`));
  });

  it('the simulator flag table (docs/simulations.md) names the simulator defaults', () => {
    const parsed = parseCli(['--scenario', 'uniform']);
    if (parsed.help) throw new Error('parsed as --help');
    const table = read('docs/simulations.md');
    const defaultOf = (flag: string) =>
      new RegExp(`^\\| \`${flag}[^|]*\\|[^|]*\\| ([^|]+?) +\\|$`, 'm').exec(table)?.[1];
    expect(defaultOf('--regions N')).toBe(String(parsed.regionCount));
    expect(defaultOf('--seed S')).toBe(String(parsed.seed));
    expect(defaultOf('--duration S')).toBe(String(DEFAULT_SETTINGS.durationS));
    expect(defaultOf('--strategies a,b,…')).toBe(
      parsed.strategies.length === DEFAULT_STRATEGIES.length && DEFAULT_STRATEGIES.length === 6
        ? 'all six'
        : 'changed',
    );
  });

  it('the simulator settings list (docs/simulations.md, "Settings") is what --help prints', () => {
    const section = read('docs/simulations.md').split('\n## Settings\n')[1]!;
    const block = /```\n([\s\S]*?)```/.exec(section)![1]!;
    const documented = block
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => l.trim().split(/\s+/).slice(0, 2).join(' '));
    const printed = describeSettings().map((l) => l.trim().split(/\s+/).slice(0, 2).join(' '));
    expect(documented).toEqual(printed);
  });

  it("prose that gives a default in passing gives the code's", () => {
    const docs = ['README.md', ...readdirSync(new URL('docs/', root)).map((f) => `docs/${f}`)].filter((f) =>
      f.endsWith('.md'),
    );
    const found: string[] = [];
    for (const file of docs) {
      const text = read(file).replace(/\s+/g, ' ');
      // `NAME` (N by default …) and `NAME` (default N): a plain number, no unit.
      for (const m of text.matchAll(/`([A-Za-z_]+)` \((?:([\d.]+) by default|default ([\d.]+)\))/g)) {
        const name = m[1]!;
        const documented = m[2] ?? m[3]!;
        const field = agentFields.get(name) ?? coordinatorFields.get(name);
        const actual =
          field !== undefined
            ? schemaDefault(field).text
            : String(ownValue(DEFAULT_SETTINGS as unknown as Record<string, unknown>, name));
        found.push(
          `${file}: ${name} ${documented === actual ? 'ok' : `documented ${documented}, code ${actual}`}`,
        );
      }
    }
    expect(found.length).toBeGreaterThanOrEqual(2);
    expect(found.filter((f) => !f.endsWith(' ok'))).toEqual([]);
    // docs/protocol.md lists the rebalancer's settings in one sentence.
    const line = /Rebalancer settings[^:]*: (.*?)cool-down/s
      .exec(read('docs/protocol.md'))?.[1]
      ?.replace(/\s+/g, ' ');
    const r = defaultRebalanceSettings;
    expect(line).toContain(
      `demand half-life ${r.demandHalfLifeMs} ms, damping ${r.damping}, largest step ${r.maxStep}`,
    );
    expect(line).toContain(
      `hysteresis ${r.hysteresis}, settle band ${r.settleBand}, confirm ${r.confirmMs / 1000} s`,
    );
    expect(line).toContain(`unmet fraction ${r.unmetFraction}, default floor ${r.defaultMinShare}`);
  });

  it('a drifted default is found', () => {
    const service = SERVICES[0]!;
    const row: Row = {
      file: 'x.md',
      name: 'QP_STORE_TIMEOUT_MS',
      documented: classify('`60`'),
      cell: '`60`',
    };
    expect(check(service, [row])).toEqual([
      'x.md: QP_STORE_TIMEOUT_MS: documented 60, the schema defaults to 50',
    ]);
    expect(check(service, [{ ...row, documented: classify('none'), cell: 'none' }])).toEqual([
      'x.md: QP_STORE_TIMEOUT_MS: documented "none", the schema defaults to 50',
    ]);
    expect(check(service, [{ ...row, name: 'QP_GONE' }])).toEqual([
      'x.md: QP_GONE: not read by the agent (regional-agent/config.ts)',
    ]);
  });
});
