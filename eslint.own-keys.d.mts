/** Types of eslint.own-keys.mjs, for the test that proves its rule (test/unit/repo/own-keys-rule.test.ts). */
import type { ESLint } from 'eslint';

export declare const ownKeysPlugin: ESLint.Plugin;
export declare const zodRecordSelector: { selector: string; message: string };
export declare const OWN_KEY_FILES: readonly string[];
