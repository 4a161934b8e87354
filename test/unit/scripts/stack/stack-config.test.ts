import { describe, expect, it } from 'vitest';
import { loadStackConfig, plannedPorts, StackConfigError } from '../../../../scripts/stack/config.js';
import { compiledEntry, serviceCommand } from '../../../../scripts/stack/services.js';

function problems(env: Record<string, string>): string[] {
  try {
    loadStackConfig(env);
  } catch (error) {
    expect(error).toBeInstanceOf(StackConfigError);
    return [...(error as StackConfigError).problems];
  }
  return [];
}

describe('stack configuration', () => {
  it('defaults to the documented loopback ports, binaries or Docker, and a seeded demo policy', () => {
    const c = loadStackConfig({});
    expect(c.host).toBe('127.0.0.1');
    expect(c.coordinatorPort).toBe(7100);
    expect(c.natsPort).toBe(7110);
    expect(c.regions).toEqual([
      { name: 'us', agentPort: 7101, grpcPort: 7141, redis: { kind: 'single', port: 7111 } },
      { name: 'eu', agentPort: 7102, grpcPort: 7142, redis: { kind: 'single', port: 7121 } },
      { name: 'ap', agentPort: 7103, grpcPort: 7143, redis: { kind: 'single', port: 7131 } },
    ]);
    expect(c).toMatchObject({
      servers: 'auto',
      adminToken: undefined,
      readToken: undefined,
      namespace: 'qp',
      seed: true,
      keepData: false,
      readyTimeoutMs: 90_000,
      logLevel: 'info',
      images: { redis: 'redis:7.2-alpine', nats: 'nats:2.10-alpine' },
    });
    expect(Object.isFrozen(c)).toBe(true);
  });

  it('writes the env file by default, and none when QP_STACK_ENV_FILE is empty', () => {
    expect(loadStackConfig({}).envFile).toBe('.quotaplane/stack.env');
    expect(loadStackConfig({ QP_STACK_ENV_FILE: '' }).envFile).toBeUndefined();
    expect(loadStackConfig({ QP_STACK_ENV_FILE: '/tmp/x.env' }).envFile).toBe('/tmp/x.env');
  });

  it('reads every port, the tokens and the images from the environment', () => {
    const c = loadStackConfig({
      QP_STACK_COORDINATOR_PORT: '8100',
      QP_STACK_US_PORT: '8101',
      QP_STACK_EU_PORT: '8102',
      QP_STACK_AP_PORT: '8103',
      QP_STACK_NATS_PORT: '8110',
      QP_STACK_US_REDIS_PORT: '8111',
      QP_STACK_EU_REDIS_PORT: '8121',
      QP_STACK_AP_REDIS_PORT: '0',
      QP_STACK_US_GRPC_PORT: '8141',
      QP_STACK_EU_GRPC_PORT: '8142',
      QP_STACK_AP_GRPC_PORT: '8143',
      QP_ADMIN_TOKEN: 'admin-token-0123456789',
      QP_READ_TOKEN: 'read-token-0123456789',
      QP_STACK_SERVERS: 'docker',
      REDIS_IMAGE: 'local/redis:7',
      NATS_IMAGE: 'local/nats:2',
    });
    expect(plannedPorts(c).map((p) => [p.name, p.port])).toEqual([
      ['coordinator admin API', 8100],
      ['nats', 8110],
      ['agent us', 8101],
      ['agent us gRPC', 8141],
      ['redis us', 8111],
      ['agent eu', 8102],
      ['agent eu gRPC', 8142],
      ['redis eu', 8121],
      ['agent ap', 8103],
      ['agent ap gRPC', 8143],
      ['redis ap', 0],
    ]);
    expect(c.adminToken).toBe('admin-token-0123456789');
    expect(c.readToken).toBe('read-token-0123456789');
    expect(c.servers).toBe('docker');
    expect(c.images).toEqual({ redis: 'local/redis:7', nats: 'local/nats:2' });
  });

  it('puts a cluster region on three consecutive ports and plans their bus ports too', () => {
    const c = loadStackConfig({ QP_STACK_CLUSTER_REGIONS: 'eu', QP_STACK_EU_REDIS_PORT: '9000' });
    expect(c.regions[1]!.redis).toEqual({ kind: 'cluster', ports: [9000, 9001, 9002] });
    expect(c.regions[0]!.redis).toEqual({ kind: 'single', port: 7111 });
    const eu = plannedPorts(c).filter((p) => p.name.startsWith('redis eu'));
    expect(eu.map((p) => p.port)).toEqual([9000, 19_000, 9001, 19_001, 9002, 19_002]);
    expect(eu.every((p) => p.env === 'QP_STACK_EU_REDIS_PORT')).toBe(true);
  });

  it('puts a Sentinel region on three nodes with a sentinel beside each, and never on a cluster too', () => {
    const c = loadStackConfig({ QP_STACK_SENTINEL_REGIONS: 'ap', QP_STACK_AP_REDIS_PORT: '9100' });
    expect(c.regions[2]!.redis).toEqual({ kind: 'sentinel', ports: [9100, 9101, 9102] });
    const ap = plannedPorts(c).filter((p) => p.name.startsWith('redis ap'));
    expect(ap.map((p) => `${p.name} ${p.port}`)).toEqual([
      'redis ap master 9100',
      'redis ap sentinel 1 19100',
      'redis ap replica 1 9101',
      'redis ap sentinel 2 19101',
      'redis ap replica 2 9102',
      'redis ap sentinel 3 19102',
    ]);
    expect(problems({ QP_STACK_SENTINEL_REGIONS: 'ap,eu', QP_STACK_CLUSTER_REGIONS: 'eu' })).toEqual([
      'QP_STACK_SENTINEL_REGIONS: a region is on a cluster or under Sentinel, not both: eu',
    ]);
  });

  it('maps QP_COORDINATOR_* and QP_AGENT_* onto the services', () => {
    const c = loadStackConfig({ QP_COORDINATOR_LEASE_MS: '3000', QP_AGENT_DECISION_DEADLINE_MS: '80' });
    expect(c.coordinatorEnv).toEqual({ QP_LEASE_MS: '3000' });
    expect(c.agentEnv).toEqual({ QP_DECISION_DEADLINE_MS: '80' });
  });

  it('lists every problem at once', () => {
    const found = problems({
      QP_STACK_US_PORT: '70000',
      QP_STACK_SERVERS: 'podman',
      QP_ADMIN_TOKEN: 'short',
      QP_STACK_CLUSTER_REGIONS: 'eu,mars',
      QP_STACK_SEED: 'maybe',
      QP_AGENT_PORT: '9999',
      QP_COORDINATOR_REGIONS: 'us',
    });
    expect(found).toHaveLength(7);
    expect(found.join('\n')).toMatch(/QP_STACK_US_PORT: ports are integers 0-65535/);
    expect(found.join('\n')).toMatch(/QP_STACK_SERVERS:/);
    expect(found.join('\n')).toMatch(/QP_ADMIN_TOKEN: tokens must be at least 16 characters/);
    expect(found.join('\n')).toMatch(/QP_STACK_CLUSTER_REGIONS: regions are us, eu, ap/);
    expect(found.join('\n')).toMatch(/QP_STACK_SEED: use true or false/);
    expect(found).toContain('QP_AGENT_PORT: the launcher sets QP_PORT itself');
    expect(found).toContain('QP_COORDINATOR_REGIONS: the launcher sets QP_REGIONS itself');
    expect(found.join('\n')).not.toContain('short');
  });

  it('refuses a port asked for twice, the same token for both roles, and a cluster too high for its bus', () => {
    expect(problems({ QP_STACK_US_PORT: '7100' })).toEqual([
      'port 7100 is asked for twice: coordinator admin API and agent us',
    ]);
    expect(problems({ QP_STACK_CLUSTER_REGIONS: 'ap', QP_STACK_AP_REDIS_PORT: '7101' })).toEqual([
      'port 7101 is asked for twice: agent us and redis ap node 1',
      'port 7102 is asked for twice: agent eu and redis ap node 2',
      'port 7103 is asked for twice: agent ap and redis ap node 3',
    ]);
    expect(
      problems({ QP_ADMIN_TOKEN: 'same-token-0123456789', QP_READ_TOKEN: 'same-token-0123456789' }),
    ).toEqual(['QP_READ_TOKEN: must differ from QP_ADMIN_TOKEN']);
    expect(problems({ QP_STACK_CLUSTER_REGIONS: 'us', QP_STACK_US_REDIS_PORT: '55534' })).toEqual([
      'QP_STACK_US_REDIS_PORT: a cluster or Sentinel region needs ports P..P+2 and P+10000..P+10002 ≤ 65535',
    ]);
    expect(problems({ QP_STACK_CLUSTER_REGIONS: 'us', QP_STACK_US_REDIS_PORT: '55533' })).toEqual([]);
  });

  it('plans the geo topology: a NATS server per region, six links and their control API, the round trips', () => {
    const single = loadStackConfig({});
    expect(single.topology).toBe('single');
    expect(single.geo).toBeUndefined();
    expect(plannedPorts(single).some((p) => p.name.startsWith('link'))).toBe(false);
    const c = loadStackConfig({
      QP_STACK_TOPOLOGY: 'geo',
      QP_STACK_ROUND_TRIPS: 'us-eu=80,eu-ap=200,us-ap=140',
    });
    expect(c.geo!.servers).toEqual([
      { region: 'us', port: 7114, routePort: 7115, monitorPort: 7116 },
      { region: 'eu', port: 7124, routePort: 7125, monitorPort: 7126 },
      { region: 'ap', port: 7134, routePort: 7135, monitorPort: 7136 },
    ]);
    expect(c.geo!.links.map((l) => [`${l.from}>${l.to}`, l.port])).toEqual([
      ['us>eu', 7151],
      ['us>ap', 7152],
      ['eu>us', 7153],
      ['eu>ap', 7154],
      ['ap>us', 7155],
      ['ap>eu', 7156],
    ]);
    expect(c.geo!.controlPort).toBe(7150);
    expect(c.geo!.jitter).toBe(0.1);
    expect([...c.geo!.roundTrips.values()].sort((a, b) => a - b)).toEqual([80, 140, 200]);
    const planned = plannedPorts(c);
    expect(planned.some((p) => p.name === 'nats')).toBe(false);
    expect(planned.find((p) => p.name === 'link ap → eu')).toEqual({
      name: 'link ap → eu',
      env: 'QP_STACK_AP_EU_LINK_PORT',
      port: 7156,
    });
    expect(planned).toHaveLength(1 + 9 + 6 + 1 + 3 * 3);
  });

  it('refuses a geo topology whose round trips miss a pair or name an unknown region', () => {
    expect(problems({ QP_STACK_TOPOLOGY: 'geo', QP_STACK_ROUND_TRIPS: 'us-eu=70,us-ap=150' })).toEqual([
      'QP_STACK_ROUND_TRIPS: no round trip for eu-ap (e.g. us-eu=70,us-ap=150,eu-ap=220)',
    ]);
    expect(
      problems({
        QP_STACK_TOPOLOGY: 'geo',
        QP_STACK_ROUND_TRIPS: 'us-mars=70,us-eu=-1',
        QP_STACK_LINK_JITTER: '1',
      }),
    ).toEqual(['QP_STACK_LINK_JITTER: QP_STACK_LINK_JITTER is a fraction in [0, 1)']);
    expect(problems({ QP_STACK_TOPOLOGY: 'geo', QP_STACK_ROUND_TRIPS: 'us-mars=70,us-eu=-1' })).toEqual([
      'QP_STACK_ROUND_TRIPS: us-mars does not join two of the regions us, eu, ap',
      'QP_STACK_ROUND_TRIPS: us-eu: the round trip is a number of ms in [0, 10000]',
    ]);
    expect(problems({ QP_STACK_TOPOLOGY: 'geo', QP_STACK_US_NATS_PORT: '7100' })).toEqual([
      'port 7100 is asked for twice: coordinator admin API and nats us',
    ]);
  });

  it('treats empty variables as unset', () => {
    const c = loadStackConfig({ QP_STACK_COORDINATOR_PORT: '', QP_ADMIN_TOKEN: '' });
    expect(c.coordinatorPort).toBe(7100);
    expect(c.adminToken).toBeUndefined();
  });
});

describe('how the stack runs its services', () => {
  it('from source through tsx by default, compiled from dist/ with QP_STACK_RUNTIME=compiled (npm start)', () => {
    expect(loadStackConfig({}).runtime).toBe('source');
    expect(loadStackConfig({ QP_STACK_RUNTIME: 'compiled' }).runtime).toBe('compiled');
    expect(() => loadStackConfig({ QP_STACK_RUNTIME: 'bundled' })).toThrow(StackConfigError);
    expect(serviceCommand('regional-agent/main.ts')).toEqual({
      command: process.execPath,
      args: ['--import', 'tsx', 'regional-agent/main.ts'],
    });
    expect(serviceCommand('coordinator/main.ts', 'compiled')).toEqual({
      command: process.execPath,
      args: ['dist/coordinator/main.js'],
    });
    expect(compiledEntry('regional-agent/main.ts')).toBe('dist/regional-agent/main.js');
  });
});
