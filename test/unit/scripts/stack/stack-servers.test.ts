import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ensureSecretsBundle } from '../../../../coordinator/nats/secrets-bundle.js';
import { loadStackConfig } from '../../../../scripts/stack/config.js';
import { slotRanges } from '../../../../scripts/stack/redis-cluster.js';
import {
  chooseServers,
  NoServersError,
  type ServerRunner,
  type Toolbox,
} from '../../../../scripts/stack/servers.js';
import {
  agentEnv,
  baseEnv,
  coordinatorEnv,
  STACK_ID_VAR,
  type StackSecrets,
} from '../../../../scripts/stack/services.js';

const runner = (kind: ServerRunner['kind']): ServerRunner => ({
  kind,
  description: kind,
  redis: () => {
    throw new Error('not started in unit tests');
  },
  sentinel: () => {
    throw new Error('not started in unit tests');
  },
  natsView: () => ({ secretsDir: '/s', storeDir: '/d' }),
  nats: () => {
    throw new Error('not started in unit tests');
  },
  cleanup: () => Promise.resolve(),
});
const make = { binaries: () => runner('binaries'), docker: () => runner('docker') };

function tools(commands: string[], dockerProblem?: string): Toolbox & { dockerAsked: number } {
  const t = {
    dockerAsked: 0,
    hasCommand: (name: string) => commands.includes(name),
    dockerProblem: () => {
      t.dockerAsked++;
      return Promise.resolve(dockerProblem);
    },
  };
  return t;
}

async function refusal(promise: Promise<unknown>): Promise<string> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(NoServersError);
  return (error as Error).message;
}

describe('where the servers come from', () => {
  it('auto: the binaries when both are on PATH, without asking Docker', async () => {
    const t = tools(['redis-server', 'nats-server', 'docker']);
    expect((await chooseServers('auto', t, make)).kind).toBe('binaries');
    expect(t.dockerAsked).toBe(0);
  });

  it('auto: Docker when a binary is missing and the daemon answers', async () => {
    expect((await chooseServers('auto', tools(['redis-server']), make)).kind).toBe('docker');
    expect((await chooseServers('auto', tools([]), make)).kind).toBe('docker');
  });

  it('auto with neither: says what is missing and what to install', async () => {
    const text = await refusal(chooseServers('auto', tools(['redis-server'], 'docker is not on PATH'), make));
    expect(text).toContain('nats-server is not on PATH');
    expect(text).not.toContain('redis-server is not on PATH');
    expect(text).toContain('docker is not on PATH');
    expect(text).toContain('apt-get install -y redis-server nats-server');
    expect(text).toContain('brew install redis nats-server');
    expect(text).toContain('https://docs.docker.com/engine/install/');
  });

  it('binaries forced: refuses when one is missing, even if Docker would do', async () => {
    const text = await refusal(chooseServers('binaries', tools(['nats-server', 'docker']), make));
    expect(text).toContain('QP_STACK_SERVERS=binaries but redis-server is not on PATH');
  });

  it('docker forced: uses it even with the binaries there, and refuses when the daemon is down', async () => {
    expect((await chooseServers('docker', tools(['redis-server', 'nats-server']), make)).kind).toBe('docker');
    const text = await refusal(
      chooseServers('docker', tools([], 'docker is installed but its daemon does not answer (x)'), make),
    );
    expect(text).toContain('QP_STACK_SERVERS=docker but docker is installed but its daemon does not answer');
  });
});

describe('service environments', () => {
  const config = loadStackConfig({
    QP_STACK_CLUSTER_REGIONS: 'eu',
    QP_COORDINATOR_LEASE_MS: '3000',
    QP_AGENT_DECISION_DEADLINE_MS: '80',
    QP_STACK_LOG_LEVEL: 'warn',
  });
  const tokens = { admin: 'admin-token-0123456789', read: 'read-token-0123456789' };
  const secrets: StackSecrets = {
    caFile: '/secrets/tls/ca.pem',
    nkeyFile: (identity) => `/secrets/nkeys/${identity}.nk`,
    subjectSecret: { QP_HMAC_SECRET_FILE: '/secrets/subject-hmac.key' },
  };

  it('children inherit the environment without any QP_ or image variable, and carry the stack id', () => {
    const base = baseEnv(
      { PATH: '/bin', QP_PORT: '1', QP_REGION: 'x', REDIS_IMAGE: 'r', HOME: '/root' },
      'abc',
    );
    expect(base).toEqual({ PATH: '/bin', HOME: '/root', [STACK_ID_VAR]: 'abc' });
  });

  it('the coordinator gets the regions, both tokens, NATS, its port and its pass-through settings', () => {
    const env = coordinatorEnv(config, tokens, { PATH: '/bin' }, secrets);
    expect(env).toEqual({
      PATH: '/bin',
      QP_LOG_LEVEL: 'warn',
      QP_LEASE_MS: '3000',
      QP_REGIONS: 'us,eu,ap',
      QP_ADMIN_TOKEN: tokens.admin,
      QP_READ_TOKEN: tokens.read,
      QP_NATS_URL: 'tls://127.0.0.1:7110',
      QP_NATS_NKEY_FILE: '/secrets/nkeys/coordinator.nk',
      QP_NATS_TLS_CA_FILE: '/secrets/tls/ca.pem',
      QP_HOST: '127.0.0.1',
      QP_PORT: '7100',
      QP_KV_NAMESPACE: 'qp',
    });
  });

  it('an agent gets its region, its Redis (one URL or cluster seeds), NATS, its port and trusts its host', () => {
    const us = agentEnv(config, config.regions[0]!, {}, secrets);
    expect(us).toEqual({
      QP_LOG_LEVEL: 'warn',
      QP_TRUSTED_PROXIES: '127.0.0.1',
      QP_DECISION_DEADLINE_MS: '80',
      QP_HMAC_SECRET_FILE: '/secrets/subject-hmac.key',
      QP_REGION: 'us',
      QP_REDIS_URL: 'redis://127.0.0.1:7111',
      QP_NATS_URL: 'tls://127.0.0.1:7110',
      QP_NATS_NKEY_FILE: '/secrets/nkeys/agent-us-1.nk',
      QP_NATS_TLS_CA_FILE: '/secrets/tls/ca.pem',
      QP_KV_NAMESPACE: 'qp',
      QP_HOST: '127.0.0.1',
      QP_PORT: '7101',
      QP_GRPC_PORT: '7141',
      QP_INSTANCE: 'us-127.0.0.1:7101',
    });
    const eu = agentEnv(config, config.regions[1]!, {}, secrets);
    expect(eu['QP_REDIS_CLUSTER_NODES']).toBe('127.0.0.1:7121,127.0.0.1:7122,127.0.0.1:7123');
    expect(eu['QP_REDIS_URL']).toBeUndefined();
    expect(eu['QP_NATS_NKEY_FILE']).toBe('/secrets/nkeys/agent-eu-1.nk');
    const sentinelled = loadStackConfig({ QP_STACK_SENTINEL_REGIONS: 'ap' });
    const ap = agentEnv(sentinelled, sentinelled.regions[2]!, {}, secrets);
    expect([ap['QP_REDIS_SENTINELS'], ap['QP_REDIS_MASTER_NAME'], ap['QP_REDIS_URL']]).toEqual([
      '127.0.0.1:17131,127.0.0.1:17132,127.0.0.1:17133',
      'qp-ap',
      undefined,
    ]);
    const given = agentEnv(
      config,
      config.regions[1]!,
      {},
      {
        ...secrets,
        subjectSecret: { QP_HMAC_SECRET: 'secret-0123456789abcdef' },
      },
    );
    expect(given['QP_HMAC_SECRET']).toBe('secret-0123456789abcdef');
    expect(given['QP_HMAC_SECRET_FILE']).toBeUndefined();
  });

  it('the secrets bundle: generated once, kept across runs, the configuration written where the run says', () => {
    const dir = mkdtempSync(join(tmpdir(), 'qp-secrets-'));
    try {
      const make = (configFile: string) =>
        ensureSecretsBundle(join(dir, 'secrets'), {
          namespace: 'qp',
          regions: ['us', 'eu', 'ap'],
          tls: { altNames: ['127.0.0.1', 'localhost'] },
          host: '127.0.0.1',
          port: 7110,
          jetstreamDir: join(dir, 'js'),
          configFile,
        });
      const first = make(join(dir, 'run-1.conf'));
      const key = readFileSync(first.hmacKeyFile, 'utf8');
      const seed = readFileSync(first.nkeyFile('agent-us-1'), 'utf8');
      const ca = readFileSync(first.caFile!, 'utf8');
      expect(key.trim()).toMatch(/^[A-Za-z0-9_-]{43}$/);
      for (const file of [first.hmacKeyFile, first.nkeyFile('coordinator'), first.caFile!]) {
        expect(statSync(file).mode & 0o777).toBe(0o600);
      }
      const second = make(join(dir, 'run-2.conf'));
      expect(readFileSync(second.hmacKeyFile, 'utf8')).toBe(key);
      expect(readFileSync(second.nkeyFile('agent-us-1'), 'utf8')).toBe(seed);
      expect(readFileSync(second.caFile!, 'utf8')).toBe(ca);
      expect(existsSync(join(dir, 'run-1.conf')) && existsSync(join(dir, 'run-2.conf'))).toBe(true);
      expect(existsSync(join(dir, 'secrets', 'nats-server.conf'))).toBe(false);
      const conf = JSON.parse(readFileSync(second.configFile, 'utf8')) as Record<string, unknown>;
      expect(conf).toMatchObject({
        host: '127.0.0.1',
        port: 7110,
        jetstream: { store_dir: join(dir, 'js') },
      });
      expect((conf['authorization'] as { users: unknown[] }).users).toHaveLength(4);
      // A certificate that does not cover the names asked for is made afresh.
      const moved = ensureSecretsBundle(join(dir, 'secrets'), {
        namespace: 'qp',
        regions: ['us', 'eu', 'ap'],
        tls: { altNames: ['127.0.0.2'] },
        configFile: join(dir, 'run-3.conf'),
      });
      expect(readFileSync(moved.caFile!, 'utf8')).not.toBe(ca);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('cluster slots', () => {
  it('splits 16384 slots over three masters as redis-cli does, with no gap and no overlap', () => {
    expect(slotRanges(3)).toEqual([
      [0, 5460],
      [5461, 10922],
      [10923, 16383],
    ]);
    for (const n of [1, 2, 3, 5, 7]) {
      const ranges = slotRanges(n);
      expect(ranges[0]![0]).toBe(0);
      expect(ranges.at(-1)![1]).toBe(16_383);
      for (let i = 1; i < n; i++) expect(ranges[i]![0]).toBe(ranges[i - 1]![1] + 1);
    }
  });
});
