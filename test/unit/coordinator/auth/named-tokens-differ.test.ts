/**
 * Every configured token must differ (docs/coordinator.md, Authentication): one secret configured twice is one
 * credential with two roles, and the verifier answers with the first grant it matches. The check was skipped
 * whenever QP_ADMIN_TOKEN and QP_READ_TOKEN were both unset (`undefined !== undefined` is false), the
 * deployment docs/coordinator.md describes for named tokens only: a secret given to a read-only dashboard that
 * is also a write token's (a copied line of QP_ADMIN_TOKENS_FILE) started a coordinator where it writes.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../../../coordinator/config.js';

const SAME = 'shared-secret-0123456789abcdef';

function problems(env: Record<string, string>, file?: string): readonly string[] {
  try {
    loadConfig(env, () => file ?? '');
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  return [];
}

describe('named tokens alone', () => {
  it('refuse one secret under two names, inline or from the file', () => {
    expect(
      problems({ QP_REGIONS: 'us,eu', QP_ADMIN_TOKENS: `ci:write:${SAME},grafana:read:${SAME}` }),
    ).toEqual(['QP_ADMIN_TOKENS: every token must differ']);
    expect(
      problems(
        { QP_REGIONS: 'us,eu', QP_ADMIN_TOKENS_FILE: '/etc/quotaplane/tokens' },
        `ci:write:${SAME}\ngrafana:read:${SAME}\n`,
      ),
    ).toEqual(['QP_ADMIN_TOKENS: every token must differ']);
  });
});
