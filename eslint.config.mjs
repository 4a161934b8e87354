// Lint rules that keep the layering honest: core/ is pure and may not reach for I/O.
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

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

export default tseslint.config(
  { ignores: ['node_modules/**', 'dist/**', 'coverage/**', '.sim-out/**'] },
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        projectService: { allowDefaultProject: ['*.mjs'] },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    plugins: { 'import-x': importX },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'import-x/no-cycle': 'error',
      'no-restricted-syntax': [
        'error',
        { selector: 'ExportAllDeclaration', message: 'Use explicit named exports, not export *.' },
      ],
    },
  },
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
              group: ['**/regional-agent/**', '**/coordinator/**', '**/simulations/**'],
              message: 'core/ depends on nothing above it.',
            },
          ],
        },
      ],
    },
  },
  { files: ['**/*.mjs'], ...tseslint.configs.disableTypeChecked },
);
