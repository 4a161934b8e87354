import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../../coordinator/config.js';

const ADMIN = 'admin-secret-0123456789';
const base = { QP_REGIONS: 'us,eu,ap', QP_ADMIN_TOKEN: ADMIN };

function problems(env: Record<string, string>): readonly string[] {
  try {
    loadConfig(env);
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  return [];
}

describe('coordinator configuration', () => {
  it('fills every default and freezes the result', () => {
    const c = loadConfig(base);
    expect(c).toEqual({
      natsServers: ['nats://127.0.0.1:4222'],
      natsAuth: { nkeyFile: undefined, tlsCaFile: undefined },
      regions: ['us', 'eu', 'ap'],
      tokens: [{ token: ADMIN, principal: { role: 'write', name: 'admin' } }],
      metricsAuth: 'none',
      metricsListener: undefined,
      auditRefusals: { windowMs: 10_000, perMinute: 60 },
      host: '127.0.0.1',
      port: 7100,
      logLevel: 'info',
      kvNamespace: 'qp',
      natsTimeoutMs: 2000,
      replicas: 1,
      leader: { leaseMs: 10_000, name: undefined },
      maxPolicies: 1000,
      bodyLimitBytes: 16_384,
      restoreLimitBytes: 64 * 1_048_576,
      audit: { maxRecords: 100_000, maxAgeDays: 365, maxBytes: 64 * 1_048_576 },
      shutdownGraceMs: 0,
      protocol: {
        rebalance: { roundMs: 1000, confirmMs: 60_000, maxStep: 0.05 },
        lease: {
          leaseMs: 6000,
          graceMs: 12_000,
          skewMs: 1000,
          reportIntervalMs: 1000,
          maxOverridesPerPolicy: 0,
          overrideTtlMs: 30_000,
          forgetAfterMs: 600_000,
          maxAgentsPerRegion: 64,
        },
        safeShares: undefined,
      },
    });
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.regions)).toBe(true);
    expect(Object.isFrozen(c.audit)).toBe(true);
  });

  it('reads replicas and the leader lease; 0 turns election off', () => {
    const c = loadConfig({
      ...base,
      QP_KV_REPLICAS: '3',
      QP_LEADER_LEASE_MS: '4000',
      QP_COORDINATOR_NAME: 'eu-1',
    });
    expect(c.replicas).toBe(3);
    expect(c.leader).toEqual({ leaseMs: 4000, name: 'eu-1' });
    expect(loadConfig({ ...base, QP_LEADER_LEASE_MS: '0' }).leader).toBeUndefined();
    expect(() => loadConfig({ ...base, QP_LEADER_LEASE_MS: '500' })).toThrow(/QP_LEADER_LEASE_MS/);
    expect(() => loadConfig({ ...base, QP_KV_REPLICAS: '7' })).toThrow(/QP_KV_REPLICAS/);
  });

  it('reads every variable', () => {
    const c = loadConfig({
      ...base,
      QP_NATS_URL: 'nats://a:4222, nats://b:4222',
      QP_REGIONS: ' us , eu-west ',
      QP_READ_TOKEN: 'read-secret-0123456789',
      QP_HOST: '0.0.0.0',
      QP_PORT: '8100',
      QP_LOG_LEVEL: 'debug',
      QP_KV_NAMESPACE: 'prod-1',
      QP_NATS_TIMEOUT_MS: '500',
      QP_MAX_POLICIES: '10',
      QP_BODY_LIMIT_BYTES: '4096',
      QP_AUDIT_MAX_RECORDS: '5000',
      QP_AUDIT_MAX_AGE_DAYS: '30',
      QP_AUDIT_MAX_BYTES: '2097152',
      QP_SHUTDOWN_GRACE_MS: '1500',
      QP_ADMIN_TOKENS: 'alice:write:alice-secret-0123456789,\n# CI\n grafana:read:grafana-secret-012345 ',
      QP_METRICS_AUTH: 'read',
      QP_METRICS_PORT: '9100',
      QP_AUDIT_REFUSALS_WINDOW_MS: '5000',
      QP_AUDIT_REFUSALS_PER_MINUTE: '10',
    });
    expect(c).toMatchObject({
      natsServers: ['nats://a:4222', 'nats://b:4222'],
      regions: ['us', 'eu-west'],
      tokens: [
        { token: ADMIN, principal: { role: 'write', name: 'admin' } },
        { token: 'read-secret-0123456789', principal: { role: 'read', name: 'reader' } },
        { token: 'alice-secret-0123456789', principal: { role: 'write', name: 'alice' } },
        { token: 'grafana-secret-012345', principal: { role: 'read', name: 'grafana' } },
      ],
      metricsAuth: 'read',
      metricsListener: { host: '0.0.0.0', port: 9100 },
      auditRefusals: { windowMs: 5000, perMinute: 10 },
      host: '0.0.0.0',
      port: 8100,
      logLevel: 'debug',
      kvNamespace: 'prod-1',
      natsTimeoutMs: 500,
      maxPolicies: 10,
      bodyLimitBytes: 4096,
      audit: { maxRecords: 5000, maxAgeDays: 30, maxBytes: 2_097_152 },
      shutdownGraceMs: 1500,
    });
  });

  it('lists every problem at once', () => {
    expect(
      problems({
        QP_ADMIN_TOKEN: 'short',
        QP_PORT: '70000',
        QP_LOG_LEVEL: 'loud',
        QP_NATS_URL: 'http://x',
        QP_MAX_POLICIES: '0',
        QP_KV_NAMESPACE: 'Bad.NS',
      }).map((p) => p.split(':')[0]),
    ).toEqual([
      'QP_NATS_URL.0',
      'QP_REGIONS',
      'QP_ADMIN_TOKEN',
      'QP_PORT',
      'QP_LOG_LEVEL',
      'QP_KV_NAMESPACE',
      'QP_MAX_POLICIES',
    ]);
  });

  it('refuses duplicate or malformed regions and a read token equal to the admin token', () => {
    expect(problems({ ...base, QP_REGIONS: 'us,us' })).toEqual(['QP_REGIONS: regions must be unique']);
    expect(problems({ ...base, QP_REGIONS: 'US' })[0]).toMatch(/^QP_REGIONS\.0: region names/);
    expect(problems({ ...base, QP_REGIONS: ' , ' })).toEqual(['QP_REGIONS: give at least one region']);
    expect(problems({ ...base, QP_READ_TOKEN: ADMIN })).toEqual([
      'QP_READ_TOKEN: the read token must differ from the admin token',
    ]);
  });

  it('named tokens: a write token is required, names and tokens are unique, each is name:role:token', () => {
    const { QP_REGIONS } = base;
    expect(problems({ QP_REGIONS })).toEqual([
      'QP_ADMIN_TOKEN: set QP_ADMIN_TOKEN or a write token in QP_ADMIN_TOKENS',
    ]);
    expect(problems({ QP_REGIONS, QP_ADMIN_TOKENS: 'ci:write:ci-secret-0123456789abc' })).toEqual([]);
    expect(problems({ QP_REGIONS, QP_ADMIN_TOKENS: 'grafana:read:grafana-secret-012345' })).toEqual([
      'QP_ADMIN_TOKEN: set QP_ADMIN_TOKEN or a write token in QP_ADMIN_TOKENS',
    ]);
    expect(problems({ ...base, QP_ADMIN_TOKENS: 'admin:read:other-secret-0123456789' })).toEqual([
      'QP_ADMIN_TOKENS: token name admin is used twice (admin and reader name QP_ADMIN_TOKEN and QP_READ_TOKEN)',
    ]);
    expect(problems({ ...base, QP_ADMIN_TOKENS: `ci:read:${ADMIN}` })).toEqual([
      'QP_ADMIN_TOKENS: every token must differ',
    ]);
    expect(problems({ ...base, QP_ADMIN_TOKENS: 'ci:root:ci-secret-0123456789abc' })[0]).toMatch(
      /^QP_ADMIN_TOKENS\.0\.role:/,
    );
    expect(problems({ ...base, QP_ADMIN_TOKENS: 'just-a-token-0123456789' })).toEqual([
      'QP_ADMIN_TOKENS.0: named tokens look like name:role:token',
    ]);
    expect(problems({ ...base, QP_ADMIN_TOKENS: 'ci:write:short' })[0]).toMatch(
      /^QP_ADMIN_TOKENS\.0\.token:/,
    );
  });

  it('never repeats a token in its messages', () => {
    const secret = 'has space 0123456789abcdef';
    const err = (() => {
      try {
        loadConfig({ ...base, QP_ADMIN_TOKEN: secret, QP_READ_TOKEN: 'tiny' });
      } catch (e) {
        return e as ConfigError;
      }
      throw new Error('expected a ConfigError');
    })();
    expect(err.code).toBe('COORD_ERR_CONFIG');
    expect(err.problems).toHaveLength(2);
    expect(err.message).not.toContain(secret);
    expect(err.message).not.toContain('tiny');
  });
});

describe('coordinator protocol configuration', () => {
  it('reads lease timing and safe shares', () => {
    const c = loadConfig({
      ...base,
      QP_LEASE_MS: '4000',
      QP_GRACE_MS: '9000',
      QP_SKEW_MS: '500',
      QP_ROUND_MS: '500',
      QP_SAFE_SHARES: 'us=0.5, eu=0.25, ap=0.25',
    });
    expect(c.protocol.lease).toMatchObject({ leaseMs: 4000, graceMs: 9000, skewMs: 500 });
    expect(c.protocol.safeShares).toEqual({ us: 0.5, eu: 0.25, ap: 0.25 });
  });

  it('reads the largest share step, a fraction', () => {
    expect(loadConfig({ ...base, QP_MAX_STEP: '0.1' }).protocol.rebalance.maxStep).toBe(0.1);
  });

  it.each([
    [{ QP_GRACE_MS: '8000' }, /QP_GRACE_MS must exceed QP_LEASE_MS \+ 2 × QP_SKEW_MS \+ QP_ROUND_MS/],
    [{ QP_LEASE_MS: '3999', QP_GRACE_MS: '9000' }, /leaseMs must be at least 3 × reportIntervalMs \+ skewMs/],
    [{ QP_SAFE_SHARES: 'us=0.5,eu=0.5,ap=0.5' }, /safe shares sum to 1.5, above 1/],
    [{ QP_SAFE_SHARES: 'us=0.5,eu=0.5' }, /missing regions: ap/],
    [{ QP_SAFE_SHARES: 'us=0.3,eu=0.3,ap=0.3,mars=0.1' }, /unknown regions: mars/],
    [{ QP_SAFE_SHARES: 'us:0.3' }, /safe shares look like us=0.4,eu=0.3,ap=0.3/],
    [{ QP_MAX_STEP: '0' }, /QP_MAX_STEP: Too small: expected number to be >0/],
    [{ QP_MAX_STEP: '1.5' }, /QP_MAX_STEP: Too big: expected number to be <=1/],
    [{ QP_MAX_STEP: 'abc' }, /QP_MAX_STEP: Invalid input: expected number/],
  ])('refuses %j', (env, message) => {
    expect(() => loadConfig({ ...base, ...env })).toThrow(message);
  });

  it('QP_ADMIN_TOKENS_FILE: its named tokens are added to QP_ADMIN_TOKENS; a file it cannot read is one more problem', () => {
    const files = new Map([['/run/tokens', '# CI\nci:write:ci-secret-0123456789abc\n']]);
    const readFile = (path: string) => {
      const text = files.get(path);
      if (text === undefined) throw new Error('ENOENT');
      return text;
    };
    const c = loadConfig(
      {
        QP_REGIONS: 'us',
        QP_ADMIN_TOKENS: 'grafana:read:grafana-secret-012345',
        QP_ADMIN_TOKENS_FILE: '/run/tokens',
      },
      readFile,
    );
    expect(c.tokens.map((t) => t.principal)).toEqual([
      { role: 'read', name: 'grafana' },
      { role: 'write', name: 'ci' },
    ]);
    let error: unknown;
    try {
      loadConfig({ QP_REGIONS: 'us', QP_ADMIN_TOKENS_FILE: '/run/missing', QP_PORT: 'x' }, readFile);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      'QP_ADMIN_TOKENS_FILE: cannot read /run/missing: ENOENT',
      'QP_PORT: Invalid input: expected number, received NaN',
    ]);
  });
});
