/**
 * NATS credentials and server configuration for one deployment: an nkey per process (the server keeps only the
 * public keys; each process holds its seed), each user with the subject permissions of its role
 * (core/wire/nats-permissions.ts), optionally TLS. Used by `npm start`, by the compose file's init step
 * (`coordinator/nats/init-secrets.ts`) and by the test harness, so all three run the same configuration.
 */
import { nkeys } from '@nats-io/nats-core';
import { inboxPrefix, natsPermissions, type NatsRole } from '../../core/wire/nats-permissions.js';
import { credentialTag } from '../../core/wire/protocol.js';

/** One process that connects to NATS. */
export interface NatsIdentity {
  /** File-name-safe name (`coordinator`, `agent-us-1`). */
  readonly name: string;
  readonly role: NatsRole;
}

export interface NatsCredential extends NatsIdentity {
  /** The nkey seed (`SU…`): the process's secret. */
  readonly seed: string;
  /** The nkey public key (`U…`): what the server knows. */
  readonly publicKey: string;
}

export function createCredential(identity: NatsIdentity): NatsCredential {
  const pair = nkeys.createUser();
  return {
    ...identity,
    seed: new TextDecoder().decode(pair.getSeed()),
    publicKey: pair.getPublicKey(),
  };
}

/** The public key of a seed (what the server lists), or an error naming what is wrong. */
export function publicKeyOf(seed: string): string {
  return nkeys.fromSeed(new TextEncoder().encode(seed.trim())).getPublicKey();
}

/** The identities of a deployment: the coordinator and `agentsPerRegion` agents in every region. */
export function deploymentIdentities(regions: readonly string[], agentsPerRegion = 1): NatsIdentity[] {
  const out: NatsIdentity[] = [{ name: 'coordinator', role: { kind: 'coordinator' } }];
  for (const region of regions) {
    for (let i = 1; i <= agentsPerRegion; i++) {
      out.push({ name: `agent-${region}-${i}`, role: { kind: 'agent', region } });
    }
  }
  return out;
}

export interface ServerConfigOptions {
  readonly namespace: string;
  readonly credentials: readonly NatsCredential[];
  /** JetStream storage directory; JetStream is off without it. */
  readonly jetstreamDir?: string;
  /** Listen address; left to the command line (`-a`, `-p`) when absent. */
  readonly host?: string;
  readonly port?: number;
  /** HTTP monitoring port (`/healthz`). */
  readonly monitorPort?: number;
  /** Certificate and key files: every client connection is then TLS. */
  readonly tls?: { readonly certFile: string; readonly keyFile: string };
  /** This server's name in a cluster (JetStream in a cluster requires one per server). */
  readonly serverName?: string;
  /** Membership of a cluster of servers (one per region in the geo topology; docs/running.md). */
  readonly cluster?: ClusterOptions;
}

/** How a server joins its cluster: where it listens for routes, and the routes it opens to the others. */
export interface ClusterOptions {
  readonly name: string;
  readonly host: string;
  readonly port: number;
  /** `nats-route://host:port` of the other servers (or of the links that lead to them). */
  readonly routes: readonly string[];
  /**
   * Neither tell clients of the other servers nor gossip route addresses: routes are only those listed, so
   * traffic between regions crosses the links named there and never a direct route around them.
   */
  readonly noAdvertise: boolean;
  /**
   * The route address this server tells the others to reach it at (gossip); default its listen address. A peer
   * that learns of a server it has no route to yet dials this address (an implicit route).
   */
  readonly advertise?: string;
}

/**
 * The nats-server configuration text (JSON, which nats-server reads as its own format). Permissions are
 * allow-lists: anything not listed is refused by the server, and a client without a listed nkey cannot connect.
 */
export function serverConfig(options: ServerConfigOptions): string {
  const users = options.credentials.map((c) => ({
    nkey: c.publicKey,
    // An agent publishes under its own credential's tag only: it cannot speak for another agent's id.
    permissions: natsPermissions(
      options.namespace,
      c.role.kind === 'agent' ? { ...c.role, tag: credentialTag(c.publicKey) } : c.role,
      inboxPrefix(c.publicKey),
    ),
  }));
  const cluster = options.cluster;
  const config: Record<string, unknown> = {
    ...(options.serverName !== undefined ? { server_name: options.serverName } : {}),
    ...(options.host !== undefined ? { host: options.host } : {}),
    ...(options.port !== undefined ? { port: options.port } : {}),
    ...(options.monitorPort !== undefined ? { http_port: options.monitorPort } : {}),
    max_payload: 1_048_576,
    // No credentials: an open server (the harness's plain servers); with some, nobody else connects.
    ...(users.length > 0 ? { authorization: { users } } : {}),
    ...(options.jetstreamDir !== undefined ? { jetstream: { store_dir: options.jetstreamDir } } : {}),
    ...(options.tls !== undefined
      ? { tls: { cert_file: options.tls.certFile, key_file: options.tls.keyFile, timeout: 10 } }
      : {}),
    ...(cluster !== undefined
      ? {
          cluster: {
            name: cluster.name,
            host: cluster.host,
            port: cluster.port,
            routes: cluster.routes,
            no_advertise: cluster.noAdvertise,
            ...(cluster.advertise !== undefined ? { advertise: cluster.advertise } : {}),
          },
        }
      : {}),
  };
  return `${JSON.stringify(config, null, 2)}\n`;
}
