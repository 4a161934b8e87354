/**
 * The locked-down configuration of a harness NATS server: the same secrets bundle a deployment writes
 * (coordinator/nats/secrets-bundle.ts), and the connection options of each identity in it.
 */
import { readFileSync } from 'node:fs';
import { nkeyAuthenticator } from '@nats-io/nats-core';
import { ensureSecretsBundle } from '../../coordinator/nats/secrets-bundle.js';
import { inboxPrefix } from '../../core/wire/nats-permissions.js';
import type { NatsSecurity, SecureNatsOptions } from './backend.js';

export function natsSecurity(
  dir: string,
  options: SecureNatsOptions,
  server: { serverDir?: string; jetstreamDir?: string },
): NatsSecurity {
  const bundle = ensureSecretsBundle(dir, {
    namespace: options.namespace,
    regions: options.regions,
    ...(options.agentsPerRegion !== undefined ? { agentsPerRegion: options.agentsPerRegion } : {}),
    ...(options.tls === true ? { tls: { altNames: ['127.0.0.1', 'localhost'] } } : {}),
    ...server,
  });
  return {
    bundle,
    connectOptions(name) {
      const credential = bundle.credentials.find((c) => c.name === name);
      if (credential === undefined) throw new Error(`no NATS identity named ${name}`);
      return {
        authenticator: nkeyAuthenticator(new TextEncoder().encode(credential.seed)),
        inboxPrefix: inboxPrefix(credential.publicKey),
        ...(bundle.caFile !== undefined ? { tls: { ca: readFileSync(bundle.caFile, 'utf8') } } : {}),
      };
    },
  };
}
