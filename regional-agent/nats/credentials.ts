/**
 * The agent's NATS identity: an nkey seed (the server holds its public key with the permissions of the agent's
 * region), the inbox prefix those permissions let it read (derived from the key), and the CA of a TLS server.
 */
import { readFileSync } from 'node:fs';
import { nkeyAuthenticator, nkeys, type ConnectionOptions } from '@nats-io/nats-core';
import { inboxPrefix } from '../../core/wire/nats-permissions.js';
import { credentialTag, OPEN_CREDENTIAL_TAG } from '../../core/wire/protocol.js';

type Credentials = Pick<ConnectionOptions, 'authenticator' | 'inboxPrefix' | 'tls'>;

export function natsCredentials(nkeyFile: string | undefined, tlsCaFile: string | undefined): Credentials {
  const tls: Credentials = tlsCaFile === undefined ? {} : { tls: { ca: readFileSync(tlsCaFile, 'utf8') } };
  if (nkeyFile === undefined) return tls;
  const seed = new TextEncoder().encode(readFileSync(nkeyFile, 'utf8').trim());
  const publicKey = nkeys.fromSeed(seed).getPublicKey();
  return { ...tls, authenticator: nkeyAuthenticator(seed), inboxPrefix: inboxPrefix(publicKey) };
}

/**
 * The tag of the agent's credential (core/wire/protocol.ts): the last token of the subjects it publishes on and
 * the start of its agent id. `open` without an nkey.
 */
export function natsCredentialTag(nkeyFile: string | undefined): string {
  if (nkeyFile === undefined) return OPEN_CREDENTIAL_TAG;
  const seed = new TextEncoder().encode(readFileSync(nkeyFile, 'utf8').trim());
  return credentialTag(nkeys.fromSeed(seed).getPublicKey());
}
