import { describe, expect, it } from 'vitest';
import {
  TokenVerifier,
  bearerToken,
  grantsFromConfig,
  roleAllows,
} from '../../../../coordinator/auth/tokens.js';

const ADMIN = 'admin-secret-0123456789abcdef';
const READ = 'read-secret-0123456789abcdef';

describe('bearer tokens', () => {
  const verifier = new TokenVerifier(grantsFromConfig(ADMIN, READ));

  it('maps each configured token to its principal and nothing else', () => {
    expect(verifier.verify(ADMIN)).toEqual({ role: 'write', name: 'admin' });
    expect(verifier.verify(READ)).toEqual({ role: 'read', name: 'reader' });
    for (const wrong of [
      '',
      ADMIN.slice(0, -1),
      `${ADMIN} `,
      `${ADMIN}x`,
      ADMIN.toUpperCase(),
      READ + ADMIN,
    ]) {
      expect(verifier.verify(wrong), JSON.stringify(wrong)).toBeUndefined();
    }
  });

  it('has no read principal when no read token is configured', () => {
    const adminOnly = new TokenVerifier(grantsFromConfig(ADMIN, undefined));
    expect(adminOnly.verify(READ)).toBeUndefined();
    expect(adminOnly.verify(ADMIN)?.role).toBe('write');
  });

  it('refuses an empty grant list', () => {
    expect(() => new TokenVerifier([])).toThrow(RangeError);
  });

  it('parses the Bearer scheme case-insensitively and nothing else', () => {
    expect(bearerToken(`Bearer ${ADMIN}`)).toBe(ADMIN);
    expect(bearerToken(`bearer ${ADMIN}`)).toBe(ADMIN);
    expect(bearerToken(`BEARER   ${ADMIN} `)).toBe(ADMIN);
    expect(bearerToken(undefined)).toBeUndefined();
    expect(bearerToken(ADMIN)).toBeUndefined();
    expect(bearerToken(`Basic ${ADMIN}`)).toBeUndefined();
    expect(bearerToken('Bearer ')).toBeUndefined();
    expect(bearerToken(`Bearer ${ADMIN} extra`)).toBeUndefined();
  });

  it('lets write do everything and read only read', () => {
    expect(roleAllows('write', 'write')).toBe(true);
    expect(roleAllows('write', 'read')).toBe(true);
    expect(roleAllows('read', 'read')).toBe(true);
    expect(roleAllows('read', 'write')).toBe(false);
  });
});
