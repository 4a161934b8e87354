import { describe, expect, it } from 'vitest';
import { loadStackConfig } from '../../scripts/stack/config.js';
import { slotRanges } from '../../scripts/stack/redis-cluster.js';
import {
  chooseServers,
  NoServersError,
  type ServerRunner,
  type Toolbox,
} from '../../scripts/stack/servers.js';
import { agentEnv, baseEnv, coordinatorEnv, STACK_ID_VAR } from '../../scripts/stack/services.js';

const runner = (kind: ServerRunner['kind']): ServerRunner => ({
  kind,
  description: kind,
  redis: () => {
    throw new Error('not started in unit tests');
  },
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

  it('children inherit the environment without any QP_ or image variable, and carry the stack id', () => {
    const base = baseEnv(
      { PATH: '/bin', QP_PORT: '1', QP_REGION: 'x', REDIS_IMAGE: 'r', HOME: '/root' },
      'abc',
    );
    expect(base).toEqual({ PATH: '/bin', HOME: '/root', [STACK_ID_VAR]: 'abc' });
  });

  it('the coordinator gets the regions, both tokens, NATS, its port and its pass-through settings', () => {
    const env = coordinatorEnv(config, tokens, { PATH: '/bin' });
    expect(env).toEqual({
      PATH: '/bin',
      QP_LOG_LEVEL: 'warn',
      QP_LEASE_MS: '3000',
      QP_REGIONS: 'us,eu,ap',
      QP_ADMIN_TOKEN: tokens.admin,
      QP_READ_TOKEN: tokens.read,
      QP_NATS_URL: 'nats://127.0.0.1:7110',
      QP_HOST: '127.0.0.1',
      QP_PORT: '7100',
      QP_KV_NAMESPACE: 'qp',
    });
  });

  it('an agent gets its region, its Redis (one URL or cluster seeds), NATS and its port', () => {
    const us = agentEnv(config, config.regions[0]!, {});
    expect(us).toEqual({
      QP_LOG_LEVEL: 'warn',
      QP_DECISION_DEADLINE_MS: '80',
      QP_REGION: 'us',
      QP_REDIS_URL: 'redis://127.0.0.1:7111',
      QP_NATS_URL: 'nats://127.0.0.1:7110',
      QP_KV_NAMESPACE: 'qp',
      QP_HOST: '127.0.0.1',
      QP_PORT: '7101',
      QP_INSTANCE: 'us-127.0.0.1:7101',
    });
    const eu = agentEnv(config, config.regions[1]!, {});
    expect(eu['QP_REDIS_CLUSTER_NODES']).toBe('127.0.0.1:7121,127.0.0.1:7122,127.0.0.1:7123');
    expect(eu['QP_REDIS_URL']).toBeUndefined();
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
