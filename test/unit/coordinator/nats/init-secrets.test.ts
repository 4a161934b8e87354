import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { initSecrets } from '../../../../coordinator/nats/init-secrets.js';

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe("the compose file's init step (coordinator/nats/init-secrets.ts)", () => {
  it('writes a TLS configuration with the NATS container’s paths, keeps the secrets, and rotates the subject key on demand', () => {
    const dir = mkdtempSync(join(tmpdir(), 'qp-init-'));
    dirs.push(dir);
    const env = {
      QP_SECRETS_DIR: dir,
      QP_REGIONS: 'us,eu,ap',
      QP_NATS_HOST: '127.0.0.1',
      QP_NATS_PORT: '27110',
      QP_NATS_MONITOR_PORT: '27119',
    };
    const bundle = initSecrets(env);
    expect(bundle.credentials.map((c) => c.name)).toEqual([
      'coordinator',
      'agent-us-1',
      'agent-eu-1',
      'agent-ap-1',
    ]);
    const conf = JSON.parse(readFileSync(bundle.configFile, 'utf8')) as Record<string, unknown>;
    expect(conf).toMatchObject({
      host: '127.0.0.1',
      port: 27110,
      http_port: 27119,
      jetstream: { store_dir: '/data' },
      tls: { cert_file: '/secrets/tls/server.pem', key_file: '/secrets/tls/server-key.pem' },
    });
    const key = readFileSync(bundle.hmacKeyFile, 'utf8');
    const seed = readFileSync(bundle.nkeyFile('agent-eu-1'), 'utf8');
    const again = initSecrets(env);
    expect(readFileSync(again.hmacKeyFile, 'utf8')).toBe(key);
    expect(readFileSync(again.nkeyFile('agent-eu-1'), 'utf8')).toBe(seed);
    initSecrets({ ...env, QP_HMAC_SECRET: 'a-rotated-secret-0123456789' });
    expect(readFileSync(bundle.hmacKeyFile, 'utf8')).toBe('a-rotated-secret-0123456789\n');
    expect(readFileSync(bundle.nkeyFile('agent-eu-1'), 'utf8')).toBe(seed);
  });

  it('refuses a bad environment', () => {
    expect(() => initSecrets({ QP_REGIONS: '' })).toThrow(/QP_REGIONS/);
    expect(() => initSecrets({ QP_REGIONS: 'us', QP_SECRETS_OWNER: 'node' })).toThrow(/uid:gid/);
  });
});
