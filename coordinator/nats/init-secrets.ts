/**
 * `node coordinator/nats/init-secrets.js`: the compose file's init step. Writes (or completes) the deployment's
 * secrets bundle (coordinator/nats/secrets-bundle.ts) in `QP_SECRETS_DIR`, the volume every service mounts: one
 * nkey per process, the TLS CA and server certificate, the subject HMAC key and the nats-server configuration,
 * with the paths the NATS container sees. Run again on the same volume it keeps every secret and rewrites the
 * configuration. With `QP_SECRETS_OWNER=uid:gid` (the init runs as root, the services as an unprivileged user)
 * the files are handed to that user afterwards. Exit 0 when written, 2 for a bad environment.
 */
import { chownSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { RegionName } from '../../core/policy/policy.js';
import { DEFAULT_KV_NAMESPACE, KvNamespace } from '../../core/wire/kv.js';
import { ensureSecretsBundle, type SecretsBundle } from './secrets-bundle.js';

const list = z.string().transform((v) =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0),
);
const Port = z.coerce.number().int().min(1).max(65_535);

export const InitSecretsEnv = z.object({
  QP_SECRETS_DIR: z.string().min(1).default('/secrets'),
  QP_REGIONS: list.pipe(z.array(RegionName).min(1, 'give at least one region')),
  QP_KV_NAMESPACE: KvNamespace.default(DEFAULT_KV_NAMESPACE),
  QP_AGENTS_PER_REGION: z.coerce.number().int().min(1).max(64).default(1),
  /** The address and ports nats-server listens on (its configuration file holds them). */
  QP_NATS_HOST: z.string().min(1).default('127.0.0.1'),
  QP_NATS_PORT: Port.default(4222),
  QP_NATS_MONITOR_PORT: Port.optional(),
  /** Names and addresses the server certificate covers, besides QP_NATS_HOST; `none` turns TLS off. */
  QP_NATS_TLS_NAMES: list.default(['localhost', '127.0.0.1']),
  /** Where the NATS container mounts this directory, and its JetStream storage. */
  QP_NATS_SERVER_DIR: z.string().min(1).default('/secrets'),
  QP_NATS_STORE_DIR: z.string().min(1).default('/data'),
  /** Replaces the subject HMAC key kept in the volume (rotation: docs/security.md). */
  QP_HMAC_SECRET: z.string().min(16, 'QP_HMAC_SECRET must be at least 16 characters').optional(),
  QP_SECRETS_OWNER: z
    .string()
    .regex(/^\d+:\d+$/, 'QP_SECRETS_OWNER is uid:gid, e.g. 1000:1000')
    .optional(),
});

/** Write the bundle the environment describes; the paths it holds are the NATS container's. */
export function initSecrets(env: Readonly<Record<string, string | undefined>>): SecretsBundle {
  const present = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const e = InitSecretsEnv.parse(present);
  const tlsOff = e.QP_NATS_TLS_NAMES.length === 1 && e.QP_NATS_TLS_NAMES[0] === 'none';
  const bundle = ensureSecretsBundle(e.QP_SECRETS_DIR, {
    namespace: e.QP_KV_NAMESPACE,
    regions: e.QP_REGIONS,
    agentsPerRegion: e.QP_AGENTS_PER_REGION,
    host: e.QP_NATS_HOST,
    port: e.QP_NATS_PORT,
    ...(e.QP_NATS_MONITOR_PORT !== undefined ? { monitorPort: e.QP_NATS_MONITOR_PORT } : {}),
    serverDir: e.QP_NATS_SERVER_DIR,
    jetstreamDir: e.QP_NATS_STORE_DIR,
    ...(e.QP_HMAC_SECRET !== undefined ? { hmacSecret: e.QP_HMAC_SECRET } : {}),
    ...(tlsOff ? {} : { tls: { altNames: [e.QP_NATS_HOST, ...e.QP_NATS_TLS_NAMES] } }),
  });
  if (e.QP_SECRETS_OWNER !== undefined) {
    const [uid, gid] = e.QP_SECRETS_OWNER.split(':').map(Number) as [number, number];
    const own = (path: string): void => {
      chownSync(path, uid, gid);
      if (statSync(path).isDirectory()) for (const f of readdirSync(path)) own(join(path, f));
    };
    own(bundle.dir);
  }
  return bundle;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    const bundle = initSecrets(process.env);
    process.stdout.write(
      `secrets in ${bundle.dir}: ${bundle.credentials.map((c) => c.name).join(', ')}; TLS ${bundle.caFile === undefined ? 'off' : 'on'}\n`,
    );
  } catch (error) {
    if (error instanceof z.ZodError) {
      process.stderr.write(
        `invalid init-secrets environment:\n${error.issues.map((i) => `  - ${String(i.path[0] ?? 'environment')}: ${i.message}`).join('\n')}\n`,
      );
      process.exit(2);
    }
    throw error;
  }
}
