import { describe, expect, it } from 'vitest';
import { ConfigError, envName, loadConfig } from '../../../regional-agent/config.js';

const base = { QP_REGION: 'us', QP_REDIS_URL: 'redis://127.0.0.1:6390', QP_POLICIES_FILE: 'p.json' };

function problems(env: Record<string, string>, files: Record<string, string> = {}): string[] {
  try {
    loadConfig(env, (path) => {
      const text = files[path];
      if (text === undefined) throw new Error(`ENOENT: ${path}`);
      return text;
    });
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return [...(error as ConfigError).problems];
  }
  return [];
}

describe('agent configuration', () => {
  it('direct-decision terms: off, 1000 ms by default; QP_TERM_MS within 200..2000; QP_TERMS on or off', () => {
    expect(loadConfig(base)).toMatchObject({ terms: 'off', termMs: 1000 });
    expect(loadConfig({ ...base, QP_TERMS: 'on', QP_TERM_MS: '2000' })).toMatchObject({
      terms: 'on',
      termMs: 2000,
    });
    expect(problems({ ...base, QP_TERM_MS: '199' })).toEqual([
      'QP_TERM_MS (termMs): Too small: expected number to be >=200',
    ]);
    expect(problems({ ...base, QP_TERM_MS: '2001', QP_TERMS: 'maybe' })).toEqual([
      'QP_TERMS (terms): Invalid option: expected one of "on"|"off"',
      'QP_TERM_MS (termMs): Too big: expected number to be <=2000',
    ]);
  });

  it('fills every default from the schema and freezes the result', () => {
    const c = loadConfig(base);
    expect(c).toMatchObject({
      region: 'us',
      decisionDeadlineMs: 250,
      storeTimeoutMs: 50,
      storeBatching: 'batch',
      maxInFlight: 1024,
      maxEventLoopDelayMs: 0,
      overloadRetryAfterMs: 1000,
      subjectHeader: 'x-quota-subject',
      trustedProxies: [],
      legacyHeaders: false,
      host: '127.0.0.1',
      port: 7101,
      defaultShare: 1,
      staticShares: {},
      logLevel: 'info',
      logSampleRate: 0.01,
    });
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.trustedProxies)).toBe(true);
  });

  it('reads typed values from the environment', () => {
    const c = loadConfig({
      ...base,
      QP_DECISION_DEADLINE_MS: '25',
      QP_TRUSTED_PROXIES: '10.0.0.0/8, ::1',
      QP_SUBJECT_HEADER: 'X-Tenant',
      QP_STATIC_SHARES: 'writes=0.5,reads=0.25',
      QP_LEGACY_HEADERS: 'true',
      QP_HMAC_SECRET: 'a-secret-of-enough-length',
    });
    expect(c).toMatchObject({
      decisionDeadlineMs: 25,
      trustedProxies: ['10.0.0.0/8', '::1'],
      subjectHeader: 'x-tenant',
      staticShares: { writes: 0.5, reads: 0.25 },
      legacyHeaders: true,
    });
  });

  it('takes a cluster node list instead of a URL', () => {
    const { QP_REDIS_URL: _url, ...rest } = base;
    const c = loadConfig({ ...rest, QP_REDIS_CLUSTER_NODES: '127.0.0.1:7000,127.0.0.1:7001' });
    expect(c.redisClusterNodes).toEqual(['127.0.0.1:7000', '127.0.0.1:7001']);
  });

  it('lists every problem at once, by environment variable', () => {
    const found = problems({
      QP_REGION: 'US East',
      QP_DECISION_DEADLINE_MS: '0',
      QP_TRUSTED_PROXIES: 'not-an-ip',
      QP_HMAC_SECRET: 'short',
      QP_STATIC_SHARES: 'writes=2',
      QP_LOG_LEVEL: 'chatty',
      QP_PORT: '70000',
    });
    const vars = [
      'QP_REGION',
      'QP_DECISION_DEADLINE_MS',
      'QP_TRUSTED_PROXIES',
      'QP_HMAC_SECRET',
      'QP_STATIC_SHARES',
      'QP_LOG_LEVEL',
      'QP_PORT',
      'QP_REDIS_URL',
      'QP_POLICIES_FILE',
    ];
    for (const v of vars)
      expect(
        found.some((p) => p.startsWith(v)),
        `${v} in ${found.join(' | ')}`,
      ).toBe(true);
    expect(found.find((p) => p.startsWith('QP_REDIS_URL'))).toMatch(
      /exactly one of QP_REDIS_URL, QP_REDIS_CLUSTER_NODES and QP_REDIS_SENTINELS/,
    );
  });

  it('refuses both a URL and a cluster', () => {
    expect(problems({ ...base, QP_REDIS_CLUSTER_NODES: 'h:1' })).toEqual([
      'QP_REDIS_URL (redisUrl): set exactly one of QP_REDIS_URL, QP_REDIS_CLUSTER_NODES and QP_REDIS_SENTINELS',
    ]);
  });

  it('takes sentinels with their master name, and WAIT only where a write has one node to wait on', () => {
    const { QP_REDIS_URL: _url, ...noUrl } = base;
    const sentinel = { ...noUrl, QP_REDIS_SENTINELS: 'h1:26379, h2:26379', QP_REDIS_MASTER_NAME: 'qp-us' };
    const config = loadConfig({ ...sentinel, QP_REDIS_WAIT_REPLICAS: '1' }, () => '');
    expect(config.redisSentinels).toEqual(['h1:26379', 'h2:26379']);
    expect(config.redisMasterName).toBe('qp-us');
    expect([config.redisWaitReplicas, config.redisWaitTimeoutMs]).toEqual([1, 20]);
    expect(problems({ ...noUrl, QP_REDIS_SENTINELS: 'h1:26379' })).toEqual([
      'QP_REDIS_MASTER_NAME (redisMasterName): QP_REDIS_SENTINELS and QP_REDIS_MASTER_NAME go together',
    ]);
    expect(problems({ ...sentinel, QP_REDIS_URL: 'redis://h:1' })).toEqual([
      'QP_REDIS_URL (redisUrl): set exactly one of QP_REDIS_URL, QP_REDIS_CLUSTER_NODES and QP_REDIS_SENTINELS',
    ]);
    expect(problems({ ...noUrl, QP_REDIS_CLUSTER_NODES: 'h:1', QP_REDIS_WAIT_REPLICAS: '1' })).toEqual([
      'QP_REDIS_WAIT_REPLICAS (redisWaitReplicas): QP_REDIS_WAIT_REPLICAS needs one Redis or Sentinel (a cluster routes WAIT to no slot)',
    ]);
  });

  it('reads a JSON file under the environment, which wins', () => {
    const files = {
      'agent.json': JSON.stringify({ decisionDeadlineMs: 80, legacyHeaders: true, port: 7102 }),
    };
    const c = loadConfig(
      { ...base, QP_CONFIG_FILE: 'agent.json', QP_PORT: '7103' },
      (p) => files[p as 'agent.json'],
    );
    expect(c).toMatchObject({ decisionDeadlineMs: 80, legacyHeaders: true, port: 7103 });
    expect(problems({ ...base, QP_CONFIG_FILE: 'missing.json' })[0]).toMatch(
      /QP_CONFIG_FILE missing.json: ENOENT/,
    );
    expect(problems({ ...base, QP_CONFIG_FILE: 'bad.json' }, { 'bad.json': '{' })[0]).toMatch(
      /QP_CONFIG_FILE bad.json/,
    );
    expect(problems({ ...base, QP_CONFIG_FILE: 'x.json' }, { 'x.json': '{"unknownField":1}' })[0]).toMatch(
      /unknownField/,
    );
  });

  it('reads the subject secret from QP_HMAC_SECRET_FILE, never beside QP_HMAC_SECRET', () => {
    const files = { 'hmac.key': 'a-secret-of-enough-length\n', 'short.key': 'short\n' };
    const read = (p: string) => {
      const text = files[p as keyof typeof files];
      if (text === undefined) throw new Error(`ENOENT ${p}`);
      return text;
    };
    expect(loadConfig({ ...base, QP_HMAC_SECRET_FILE: 'hmac.key' }, read).hmacSecret).toBe(
      'a-secret-of-enough-length',
    );
    expect(problems({ ...base, QP_HMAC_SECRET_FILE: 'short.key' }, files)).toEqual([
      'QP_HMAC_SECRET (hmacSecret): hmacSecret must be at least 16 characters',
    ]);
    expect(problems({ ...base, QP_HMAC_SECRET_FILE: 'gone.key' }, files)[0]).toMatch(
      /^QP_HMAC_SECRET_FILE gone.key: /,
    );
    expect(
      problems({ ...base, QP_HMAC_SECRET_FILE: 'hmac.key', QP_HMAC_SECRET: 'another-secret-long' }, files),
    ).toEqual(['QP_HMAC_SECRET_FILE and QP_HMAC_SECRET exclude each other']);
  });

  it('names environment variables from fields', () => {
    expect(envName('decisionDeadlineMs')).toBe('QP_DECISION_DEADLINE_MS');
    expect(envName('redisUrl')).toBe('QP_REDIS_URL');
  });
});
