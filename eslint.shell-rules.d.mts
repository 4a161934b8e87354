/** Types of eslint.shell-rules.mjs, for the test that proves its rules (test/unit/repo/sim-runs-core.test.ts). */
export interface CopiedRule {
  rule: string;
  selectors: string[];
}
export declare const COPIED_RULES: readonly CopiedRule[];
export declare const COPIED_RULE_EXCEPTIONS: readonly { files: string[]; rule: string }[];
export declare const SHELL_FILES: readonly string[];
export declare const SIMULATOR_IMPORTS: {
  patterns: { group: string[]; message: string }[];
};
export declare function copiedRuleSelectors(
  except?: readonly string[],
): { selector: string; message: string }[];
