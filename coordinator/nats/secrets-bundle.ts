/**
 * A deployment's secrets in one directory, generated once and kept: one nkey seed file per process, the TLS CA
 * and server certificate when TLS is on, the subject HMAC key, and the nats-server configuration made from
 * them. A second call on the same directory reuses what is there (so a restarted stack keeps its credentials and
 * its subjects' keys) and adds only what is missing; the configuration is written afresh every time. Used by
 * `npm start` (scripts/stack/launcher.ts), by the compose file's init step (coordinator/nats/init-secrets.ts)
 * and by the test harness (test/harness/nats-security.ts), so all three run the same configuration.
 *
 * Layout (files 0600, the directories 0700):
 *   nats-server.conf        server configuration (public keys and permissions only), unless `configFile` puts it
 *                           elsewhere
 *   nkeys/<name>.nk         one nkey seed per process (QP_NATS_NKEY_FILE)
 *   tls/ca.pem              the CA clients trust (QP_NATS_TLS_CA_FILE)
 *   tls/server.pem, tls/server-key.pem, tls/names (the names the certificate covers)
 *   subject-hmac.key        the subject HMAC secret (the agents' QP_HMAC_SECRET_FILE)
 *
 * Several processes may call it on one directory at once (two `npm start`s): a kept file is created under a
 * temporary name and linked into place, so each sees either nothing or the whole file, and all use the same.
 */
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  linkSync,
  mkdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import {
  createCredential,
  deploymentIdentities,
  publicKeyOf,
  serverConfig,
  type ClusterOptions,
  type NatsCredential,
  type NatsIdentity,
} from './credentials.js';
import { generateTlsMaterial } from './tls-certificates.js';

export interface BundleOptions {
  readonly namespace: string;
  readonly regions: readonly string[];
  /** Agent identities per region (`agent-<region>-<n>`). Default 1. */
  readonly agentsPerRegion?: number;
  /** Extra identities (each with its own seed). */
  readonly extra?: readonly NatsIdentity[];
  /** Names and addresses the server's certificate covers; no TLS without it. */
  readonly tls?: { readonly altNames: readonly string[] };
  /** Where the server reads this directory (a container's mount point); default: the directory itself. */
  readonly serverDir?: string;
  /** JetStream storage, as the server sees it. */
  readonly jetstreamDir?: string;
  /** A subject HMAC secret to keep instead of the one there (rotation); generated when none is there. */
  readonly hmacSecret?: string;
  /** Where to write the server configuration; default `nats-server.conf` in the directory. */
  readonly configFile?: string;
  readonly host?: string;
  readonly port?: number;
  readonly monitorPort?: number;
  /** The server's name and cluster, for a server of a cluster (the geo topology's one per region). */
  readonly serverName?: string;
  readonly cluster?: ClusterOptions;
}

export interface SecretsBundle {
  readonly dir: string;
  readonly configFile: string;
  readonly credentials: readonly NatsCredential[];
  /** The CA certificate clients trust, when TLS is on. */
  readonly caFile: string | undefined;
  readonly hmacKeyFile: string;
  /** The seed file of one identity. */
  nkeyFile(name: string): string;
}

function writeSecret(path: string, text: string): void {
  const partial = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(partial, text, { mode: 0o600 });
  chmodSync(partial, 0o600);
  renameSync(partial, path);
}

/** The file's text, made by `make` and written first if it does not exist; whoever links it first wins. */
function keep(path: string, make: () => string): string {
  if (!existsSync(path)) {
    const partial = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    writeFileSync(partial, make(), { mode: 0o600 });
    chmodSync(partial, 0o600);
    try {
      linkSync(partial, path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    } finally {
      rmSync(partial, { force: true });
    }
  }
  return readFileSync(path, 'utf8');
}

/** The TLS files: kept while they cover the names asked for, made afresh (a new CA too) when they do not. */
function ensureTls(dir: string, altNames: readonly string[]): string {
  const [ca, cert, key, names] = ['ca.pem', 'server.pem', 'server-key.pem', 'names'].map((f) =>
    join(dir, 'tls', f),
  ) as [string, string, string, string];
  const wanted = `${JSON.stringify([...new Set(altNames)].sort())}\n`;
  const current = existsSync(names) ? readFileSync(names, 'utf8') : undefined;
  if (current !== wanted || ![ca, cert, key].every((p) => existsSync(p))) {
    const material = generateTlsMaterial({ altNames });
    writeSecret(cert, material.serverCert);
    writeSecret(key, material.serverKey);
    writeSecret(ca, material.caCert);
    writeSecret(names, wanted);
  }
  return ca;
}

/** Write (or complete) the bundle in `dir` and return where everything is. */
export function ensureSecretsBundle(dir: string, options: BundleOptions): SecretsBundle {
  for (const sub of ['', 'nkeys', 'tls']) mkdirSync(join(dir, sub), { recursive: true, mode: 0o700 });
  const identities = [
    ...deploymentIdentities(options.regions, options.agentsPerRegion ?? 1),
    ...(options.extra ?? []),
  ];
  const credentials = identities.map((identity): NatsCredential => {
    const seed = keep(
      join(dir, 'nkeys', `${identity.name}.nk`),
      () => createCredential(identity).seed,
    ).trim();
    return { ...identity, seed, publicKey: publicKeyOf(seed) };
  });
  const serverDir = options.serverDir ?? dir;
  const caFile = options.tls !== undefined ? ensureTls(dir, options.tls.altNames) : undefined;
  const hmacKeyFile = join(dir, 'subject-hmac.key');
  const given = options.hmacSecret;
  if (
    given !== undefined &&
    !(existsSync(hmacKeyFile) && readFileSync(hmacKeyFile, 'utf8').trim() === given)
  ) {
    writeSecret(hmacKeyFile, `${given}\n`);
  } else {
    keep(hmacKeyFile, () => `${randomBytes(32).toString('base64url')}\n`);
  }
  const configFile = options.configFile ?? join(dir, 'nats-server.conf');
  writeSecret(
    configFile,
    serverConfig({
      namespace: options.namespace,
      credentials,
      ...(options.jetstreamDir !== undefined ? { jetstreamDir: options.jetstreamDir } : {}),
      ...(options.host !== undefined ? { host: options.host } : {}),
      ...(options.port !== undefined ? { port: options.port } : {}),
      ...(options.monitorPort !== undefined ? { monitorPort: options.monitorPort } : {}),
      ...(options.serverName !== undefined ? { serverName: options.serverName } : {}),
      ...(options.cluster !== undefined ? { cluster: options.cluster } : {}),
      ...(options.tls !== undefined
        ? {
            tls: {
              certFile: join(serverDir, 'tls', 'server.pem'),
              keyFile: join(serverDir, 'tls', 'server-key.pem'),
            },
          }
        : {}),
    }),
  );
  return {
    dir,
    configFile,
    credentials,
    caFile,
    hmacKeyFile,
    nkeyFile: (name) => {
      if (!credentials.some((c) => c.name === name)) throw new Error(`no NATS identity named ${name}`);
      return join(dir, 'nkeys', `${name}.nk`);
    },
  };
}
