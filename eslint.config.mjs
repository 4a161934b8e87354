// Lint rules that keep the layering honest: core/ is pure and may not reach for I/O.
import tseslint from 'typescript-eslint';
import importX, { createNodeResolver } from 'eslint-plugin-import-x';
import {
  COPIED_RULE_EXCEPTIONS,
  copiedRuleSelectors,
  SHELL_FILES,
  SIMULATOR_IMPORTS,
} from './eslint.shell-rules.mjs';
import { OWN_KEY_FILES, ownKeysPlugin, zodRecordSelector } from './eslint.own-keys.mjs';

const ioModules = [
  'ioredis',
  'fastify',
  'pino',
  'prom-client',
  'node:net',
  'node:fs',
  'node:fs/promises',
  'node:http',
  'node:https',
  'node:child_process',
  'node:dgram',
  'node:dns',
  'node:os',
  'node:worker_threads',
];

/** Why the coordinator, the regional agent and common/ may not import one another. */
const SERVICE_BOUNDARY =
  'coordinator/ and regional-agent/ never import each other: move what both need to core/ (pure) or common/ (I/O).';

const noExportAll = {
  selector: 'ExportAllDeclaration',
  message: 'Use explicit named exports, not export *.',
};

/** Syntax refused everywhere (each `no-restricted-syntax` list below starts with these). */
const everywhere = [noExportAll, zodRecordSelector];

/** Files allowed some copied-rule syntax (eslint.shell-rules.mjs), with the rules each may use. */
const exceptions = new Map();
for (const { files, rule } of COPIED_RULE_EXCEPTIONS) {
  for (const file of files) exceptions.set(file, [...(exceptions.get(file) ?? []), rule]);
}

export default tseslint.config(
  { ignores: ['node_modules/**', '**/dist/**', 'coverage/**', '.sim-out/**', 'coordinator/dashboard/**'] },
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        projectService: { allowDefaultProject: ['*.mjs'] },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    plugins: { 'import-x': importX },
    settings: {
      // Imports name the emitted `.js`; the sources are `.ts`. Without this no import resolves and no-cycle sees
      // no edge at all.
      'import-x/extensions': ['.ts', '.js', '.mjs'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
      'import-x/resolver-next': [
        createNodeResolver({ extensions: ['.ts', '.js', '.mjs'], extensionAlias: { '.js': ['.ts', '.js'] } }),
      ],
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'import-x/no-cycle': 'error',
      'no-restricted-syntax': ['error', ...everywhere],
    },
  },
  // One copy of each rule, in core/: the shells write none of their own (test/unit/repo/sim-runs-core.test.ts).
  {
    files: SHELL_FILES,
    rules: { 'no-restricted-syntax': ['error', ...everywhere, ...copiedRuleSelectors()] },
  },
  ...[...exceptions].map(([file, rules]) => ({
    files: [file],
    rules: { 'no-restricted-syntax': ['error', ...everywhere, ...copiedRuleSelectors(rules)] },
  })),
  {
    files: ['core/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          paths: ioModules.map((name) => ({ name, message: 'core/ is pure: no I/O imports.' })),
          patterns: [
            { group: ['@nats-io/*'], message: 'core/ is pure: no I/O imports.' },
            {
              group: ['**/regional-agent/**', '**/coordinator/**', '**/common/**', '**/simulations/**'],
              message: 'core/ depends on nothing above it.',
            },
          ],
        },
      ],
    },
  },
  // The two services never import each other: what both need is in core/ (pure) or common/ (I/O), which imports
  // neither.
  {
    files: ['coordinator/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: ['**/regional-agent/**'], message: SERVICE_BOUNDARY }] },
      ],
    },
  },
  {
    files: ['regional-agent/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: ['**/coordinator/**'], message: SERVICE_BOUNDARY }] },
      ],
    },
  },
  {
    files: ['common/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: ['**/regional-agent/**', '**/coordinator/**'], message: SERVICE_BOUNDARY }] },
      ],
    },
  },
  {
    // The simulator runs core/'s code, never the agent's or the coordinator's (it may read the agent's defaults).
    files: ['simulations/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', SIMULATOR_IMPORTS],
    },
  },
  {
    // Untrusted strings are never plain-object keys (eslint.own-keys.mjs).
    files: OWN_KEY_FILES,
    plugins: { quotaplane: ownKeysPlugin },
    rules: { 'quotaplane/no-untrusted-record-key': 'error' },
  },
  { files: ['**/*.mjs'], ...tseslint.configs.disableTypeChecked },
);
