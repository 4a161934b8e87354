/**
 * The simulator's promise is that it runs production code: the rules agents decide and report by live once, in
 * core/, and the shells (simulator, agent, coordinator, test harness) import them. eslint.shell-rules.mjs says
 * what a local copy of each rule looks like in the syntax tree; `npm run lint` applies it (eslint.config.mjs).
 * Here every shell source, simulations/replay/ included, is checked against it directly, and each pattern is
 * shown to catch a copy, on one line or split over several.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ESLint, Linter } from 'eslint';
import tseslint from 'typescript-eslint';
import { describe, expect, it } from 'vitest';
import {
  COPIED_RULE_EXCEPTIONS,
  COPIED_RULES,
  copiedRuleSelectors,
  SIMULATOR_IMPORTS,
} from '../../../eslint.shell-rules.mjs';
import { REPO_ROOT, repoFiles } from '../../helpers/repo-files.js';

const linter = new Linter({ configType: 'flat' });

/** Messages of the copied-rule check (and, for simulations/, the import restriction) on `code`. */
function lint(code: string, file: string, except: readonly string[] = []): string[] {
  const rules: Linter.RulesRecord = {
    'no-restricted-syntax': ['error', ...copiedRuleSelectors(except)],
  };
  if (file.startsWith('simulations/')) rules['no-restricted-imports'] = ['error', SIMULATOR_IMPORTS];
  const messages = linter.verify(
    code,
    [{ files: ['**/*.ts'], languageOptions: { parser: tseslint.parser }, rules }],
    { filename: file },
  );
  return messages.map((m) => `${file}:${m.line} ${m.message}`);
}

const exceptionsOf = (file: string) =>
  COPIED_RULE_EXCEPTIONS.filter((e) => e.files.includes(file)).map((e) => e.rule);

const SHELLS = ['simulations', 'regional-agent', 'coordinator', 'common', 'test/harness'];

/**
 * Every pattern needs one of these words in the source (an identifier it matches contains it), so a file without
 * any cannot hold a copy and is not parsed (parsing all of them takes seconds on a busy machine).
 */
const NEEDED =
  /capacity|refillPerSecond|remaining|SHARE_SUM|UsageMeter|UsageCounter|InForce|ShareSum|idealShares|DemandTracker|\brefill\b|\bsettle\b/i;
const mayCopy = (code: string, file: string) =>
  NEEDED.test(code) || (file.startsWith('simulations/') && /regional-agent|coordinator/.test(code));

describe('one copy of each rule, in core/', () => {
  it('the simulator (replay included), the agent, the coordinator and the test harness define none of their own', () => {
    const files = SHELLS.flatMap((dir) => repoFiles(dir, /\.ts$/));
    expect(files.filter((f) => f.startsWith('simulations/replay/')).length).toBeGreaterThan(5);
    const found = files.flatMap((file) => {
      const code = readFileSync(join(REPO_ROOT, file), 'utf8');
      return mayCopy(code, file) ? lint(code, file, exceptionsOf(file)) : [];
    });
    expect(found).toEqual([]);
  });

  it('npm run lint applies the same patterns to the same files, with the same exceptions', async () => {
    const eslint = new ESLint({ cwd: REPO_ROOT });
    const selectors = async (file: string) => {
      const config = await eslint.calculateConfigForFile(join(REPO_ROOT, file));
      const rule = config?.rules?.['no-restricted-syntax'] as [unknown, ...{ selector: string }[]];
      return rule.slice(1).map((s) => (s as { selector: string }).selector);
    };
    const all = COPIED_RULES.flatMap((r) => r.selectors);
    for (const file of ['simulations/replay/replayer.ts', 'regional-agent/app.ts', 'test/harness/nginx.ts']) {
      expect(await selectors(file), file).toEqual(expect.arrayContaining(all));
    }
    const naive = await selectors('simulations/dynamic/naive-control-plane.ts');
    expect(naive).not.toContain('NewExpression[callee.name="DemandTracker"]');
    expect(naive).toContain('VariableDeclarator[id.name="NEAR_CAPACITY_FRACTION"]');
  });

  const copies: [string, string][] = [
    ['the constrained-subject threshold', 'const NEAR_CAPACITY_FRACTION = 0.1;'],
    ['the share-sum tolerance', 'export const SHARE_SUM_TOLERANCE = 1e-9;'],
    ['share → bucket sizing', 'const b = { capacity: policy.capacity * share.share };'],
    ['share → bucket sizing', 'const r = refillPerSecond * this.share;'],
    ['share → bucket sizing', 'const r = share *\n  policy.refillPerSecond;'],
    ['share → bucket sizing', 'const c = policy!.capacity * grant!.share;'],
    ['the near-capacity test', 'if (remaining < NEAR_CAPACITY_FRACTION * capacity) hot = true;'],
    ['the near-capacity test', 'if (\n  entry.remaining <\n  0.1 * policy.capacity\n) hot = true;'],
    ['the near-capacity test', 'const hot = remainingFraction < 0.1;'],
    ['usage counting', 'export class UsageMeter {}'],
    ['usage counting', 'class RegionInForceShareMap {}'],
    ['the rebalancer', 'const ideal = idealShares(demand, floor);'],
    ['the rebalancer', 'const t = new DemandTracker(2000);'],
    ["a token bucket's decision", 'const state = refill(stored, check, now);'],
    ["a token bucket's decision", 'const r = settle(state, check, fits, fits);'],
  ];
  for (const [rule, code] of copies) {
    it(`catches a copy of ${rule}: ${code.replace(/\n\s*/g, ' ')}`, () => {
      expect(mayCopy(code, 'regional-agent/example.ts')).toBe(true);
      const found = lint(code, 'simulations/engine/example.ts');
      expect(found.length, found.join('\n')).toBe(1);
      expect(found[0]).toContain(rule);
    });
  }

  it('leaves code that imports the rules alone', () => {
    const code = [
      "import { shareOfBudget } from '../../core/shares/share-sizing.js';",
      "import { decideBucket } from '../../core/models/token-bucket.js';",
      'const gives = shareOfBudget(policy, share);',
      'const { state, result } = decideBucket(stored, check, now);',
      'const total = capacity * regions;',
    ].join('\n');
    expect(lint(code, 'simulations/engine/example.ts')).toEqual([]);
  });

  it('keeps the simulator off the agent and the coordinator, except the agent defaults', () => {
    const file = 'simulations/engine/example.ts';
    expect(
      lint("import { RedisBucketStore } from '../../regional-agent/redis/bucket-store.js';", file),
    ).toHaveLength(1);
    expect(
      lint("import { AllocationInsight } from '../../coordinator/protocol/allocation-insight.js';", file),
    ).toHaveLength(1);
    expect(
      lint("import { DEFAULT_DECISION_DEADLINE_MS } from '../../regional-agent/config.js';", file),
    ).toEqual([]);
  });
});
