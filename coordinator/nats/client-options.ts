/**
 * How the coordinator authenticates to NATS: its nkey seed file (the server knows only the public key, with the
 * coordinator's permissions) and, for `tls://` servers, the CA to trust. The inbox prefix comes from the key:
 * the only inbox the coordinator's permissions let it read.
 */
import { readFileSync } from 'node:fs';
import { nkeyAuthenticator, nkeys, type ConnectionOptions } from '@nats-io/nats-core';
import { inboxPrefix } from '../../core/wire/nats-permissions.js';

export interface NatsClientFiles {
  /** nkey seed file (`QP_NATS_NKEY_FILE`); anonymous without it. */
  readonly nkeyFile?: string | undefined;
  /** PEM CA bundle to trust (`QP_NATS_TLS_CA_FILE`); the system's CAs without it. */
  readonly tlsCaFile?: string | undefined;
}

export function natsClientOptions(
  files: NatsClientFiles,
): Pick<ConnectionOptions, 'authenticator' | 'inboxPrefix' | 'tls'> {
  const out: Pick<ConnectionOptions, 'authenticator' | 'inboxPrefix' | 'tls'> = {};
  if (files.nkeyFile !== undefined) {
    const seed = new TextEncoder().encode(readFileSync(files.nkeyFile, 'utf8').trim());
    out.authenticator = nkeyAuthenticator(seed);
    out.inboxPrefix = inboxPrefix(nkeys.fromSeed(seed).getPublicKey());
  }
  if (files.tlsCaFile !== undefined) out.tls = { ca: readFileSync(files.tlsCaFile, 'utf8') };
  return out;
}
