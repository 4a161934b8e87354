/**
 * The lint rule that keeps untrusted strings off plain-object keys (eslint.own-keys.mjs) catches the lookup issue 25
 * found (a check's class looked up as `policy.classes?.[name]`, which answered `Object` for "constructor"), its
 * kin (`in`, writes, records of records), and `z.record`; it lets Maps, arrays, literal keys and the helpers of
 * core/own-keys.ts pass. `npm run lint` applies it to every source directory.
 *
 * The rule reads types, so each probe is compiled as a small program of its own (the repository's whole program
 * takes seconds to build); its types are the ones zod infers for a policy, as the first test checks.
 */
import { join } from 'node:path';
import { ESLint, Linter } from 'eslint';
import ts from 'typescript';
import tseslint from 'typescript-eslint';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { OWN_KEY_FILES, ownKeysPlugin, zodRecordSelector } from '../../../eslint.own-keys.mjs';
import type { ClassLimits, Policy } from '../../../core/policy/policy.js';
import { CODE_DIRS, REPO_ROOT } from '../../helpers/repo-files.js';

const PROBE = '/probe/probe.ts';

/** What each rule reports on `code`: the rule and the text it points at. */
function lint(code: string): string[] {
  const options: ts.CompilerOptions = {
    strict: true,
    noUncheckedIndexedAccess: true,
    target: ts.ScriptTarget.ES2023,
    lib: ['lib.es2023.d.ts'],
    types: [],
    noEmit: true,
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  const readFile = host.readFile.bind(host);
  host.getSourceFile = (name, language, ...rest) =>
    name === PROBE ? ts.createSourceFile(name, code, language) : getSourceFile(name, language, ...rest);
  host.fileExists = (name) => name === PROBE || fileExists(name);
  host.readFile = (name) => (name === PROBE ? code : readFile(name));
  const program = ts.createProgram([PROBE], options, host);
  const messages = new Linter({ configType: 'flat', cwd: '/probe' }).verify(
    code,
    [
      {
        files: ['**/*.ts'],
        languageOptions: { parser: tseslint.parser, parserOptions: { programs: [program] } },
        plugins: { quotaplane: ownKeysPlugin },
        rules: {
          'quotaplane/no-untrusted-record-key': 'error',
          'no-restricted-syntax': ['error', zodRecordSelector],
        },
      },
    ],
    { filename: PROBE },
  );
  const lines = code.split('\n');
  return messages.map((m) => {
    const text = lines[m.line - 1]!.slice(m.column - 1, m.endLine === m.line ? m.endColumn! - 1 : undefined);
    return `${m.ruleId === 'no-restricted-syntax' ? 'z.record' : 'key'}: ${text}`;
  });
}

/** A policy's records as zod infers them (checked below), and the helpers' signatures. */
const header = `
interface ClassLimits { capacity: number; refillPerSecond: number; maxCost: number }
interface Policy { classes?: Record<string, ClassLimits> | undefined; subjects?: Record<string, string> | undefined }
declare function ownValue<T>(record: Readonly<Record<string, T>> | undefined, key: string): T | undefined;
declare function hasOwnKey(record: object | undefined, key: string): boolean;
declare const z: { record(k: unknown, v: unknown): unknown; string(): unknown; number(): unknown };
`;

describe('eslint.own-keys.mjs', () => {
  it('the probes type a policy as zod does', () => {
    expectTypeOf<NonNullable<Policy['classes']>>().toEqualTypeOf<Record<string, ClassLimits>>();
    expectTypeOf<NonNullable<Policy['subjects']>>().toEqualTypeOf<Record<string, string>>();
  });

  it('catches the lookups of issue 25: a class and a subject looked up on the policy by the names a caller sent', () => {
    // regional-agent/decisions/check-router.ts before the fix, line for line.
    const original = `${header}
export function classOf(policy: Policy, rawSubject: string, requested: string | undefined): string | undefined {
  if (requested !== undefined) {
    if (policy.classes?.[requested] === undefined) throw new RangeError(requested);
    return requested;
  }
  return policy.subjects === undefined ? undefined : policy.subjects[rawSubject];
}
`;
    expect(lint(original)).toEqual(['key: policy.classes?.[requested]', 'key: policy.subjects[rawSubject]']);
    const fixed = `${header}
export function classOf(policy: Policy, rawSubject: string, requested: string | undefined): string | undefined {
  if (requested !== undefined) {
    if (!hasOwnKey(policy.classes, requested)) throw new RangeError(requested);
    return requested;
  }
  return ownValue(policy.subjects, rawSubject);
}
`;
    expect(lint(fixed)).toEqual([]);
  });

  it('catches writes, `in`, records of records and z.record; passes Maps, arrays, literal keys and literal unions', () => {
    const code = `${header}
interface Unit { shares: Record<string, number> }
export function probe(overrides: Record<string, Unit>, region: string, subject: string, n: number) {
  const out: Record<string, number> = {};
  out[region] = 1;
  const seen = region in out;
  const share = overrides[subject]?.shares[region];
  const schema = z.record(z.string(), z.number());
  const map = new Map<string, number>();
  const list = [1, 2, 3];
  const fixed: Record<'us' | 'eu', number> = { us: 1, eu: 2 };
  const which: 'us' | 'eu' = n > 0 ? 'us' : 'eu';
  return [seen, share, schema, map.get(region), list[n], out['literal'], fixed[which], ownValue(out, region)];
}
`;
    expect(lint(code)).toEqual([
      'key: out[region]',
      'key: region in out',
      'key: overrides[subject]?.shares[region]',
      'key: overrides[subject]',
      'z.record: z.record(z.string(), z.number())',
    ]);
  });

  it('npm run lint applies both to every source directory that handles input', async () => {
    const dirs = [...CODE_DIRS, 'packages/client/src'];
    for (const dir of dirs) expect(OWN_KEY_FILES).toContain(`${dir}/**/*.ts`);
    const eslint = new ESLint({ cwd: REPO_ROOT });
    for (const file of [
      'core/policy/policy.ts',
      'regional-agent/decisions/check-router.ts',
      'coordinator/app.ts',
      'cli/run.ts',
      'simulations/engine/run.ts',
      'packages/client/src/agent-client.ts',
    ]) {
      const config = (await eslint.calculateConfigForFile(join(REPO_ROOT, file))) as {
        rules?: Record<string, unknown[]>;
      };
      expect(config.rules?.['quotaplane/no-untrusted-record-key'], file).toEqual([2]);
      expect(config.rules?.['no-restricted-syntax'], file).toContainEqual(zodRecordSelector);
    }
  });
});
