/**
 * The servers integration tests run against, behind one interface so the backend can change (local processes
 * today; containers when Docker is available) without touching a test.
 */
import type { ConnectionOptions } from '@nats-io/nats-core';
import type { SecretsBundle } from '../../coordinator/nats/secrets-bundle.js';

/** A server a test can break on purpose. */
export interface ManagedServer extends AsyncDisposable {
  readonly host: string;
  readonly port: number;
  /** Freeze the server (SIGSTOP): connections stay open, nothing answers. */
  pause(): Promise<void>;
  /** Thaw a paused server (SIGCONT). */
  resume(): Promise<void>;
  /** Stop gracefully (SIGTERM) and wait for the process to exit. */
  stop(): Promise<void>;
  /** Kill abruptly (SIGKILL) and wait for the process to exit. */
  kill(): Promise<void>;
  /** Start again on the same port (and the same data directory, for NATS JetStream). */
  start(): Promise<void>;
}

export interface RedisServer extends ManagedServer {
  readonly url: string;
}

export interface NatsServer extends ManagedServer {
  /** `nats://host:port` (`tls://host:port` when the server is locked down with TLS). */
  readonly url: string;
  /** The credentials of a locked-down server (`NatsOptions.secure`); undefined for an open one. */
  readonly security: NatsSecurity | undefined;
}

/**
 * A server locked down as a deployment is: nkey users with the permissions of their roles in one namespace
 * (coordinator/nats/secrets-bundle.ts writes the same configuration for `npm start` and the compose file).
 */
export interface SecureNatsOptions {
  readonly namespace: string;
  readonly regions: readonly string[];
  /** Agent identities per region, `agent-<region>-<n>`. Default 1. */
  readonly agentsPerRegion?: number;
  /** Serve TLS only, with a CA generated for the run. Default false. */
  readonly tls?: boolean;
}

export interface NatsSecurity {
  readonly bundle: SecretsBundle;
  /** Connection options of one identity (`coordinator`, `agent-us-1`): authenticator, inbox prefix, TLS. */
  connectOptions(
    name: string,
  ): Required<Pick<ConnectionOptions, 'authenticator' | 'inboxPrefix'>> & Pick<ConnectionOptions, 'tls'>;
}

/** A local Redis Cluster: `masters` masters, each with its replicas (none unless asked); `nodes` lists them all. */
export interface RedisCluster extends AsyncDisposable {
  readonly nodes: readonly RedisServer[];
  stop(): Promise<void>;
}

export interface NatsOptions {
  /** Enable JetStream (with its own storage directory). Default true. */
  jetstream?: boolean;
  /** Lock the server down (nkeys, per-role permissions, optional TLS). Default: open, anonymous clients. */
  secure?: SecureNatsOptions;
}

/** Where a NATS server sees its files: its own paths, or a container's. */
export interface NatsNodeView {
  /** `NatsNodeSpec.dir` as the server sees it. */
  readonly dir: string;
  /** Where it keeps JetStream data (kept across a stop and start). */
  readonly storeDir: string;
}

/**
 * One server of a NATS cluster, run from a configuration its caller writes (test/helpers/geo-topology.ts):
 * every port is fixed before the first server starts, because each server's configuration names the others'.
 */
export interface NatsNodeSpec {
  /** Client port (the configuration listens there). */
  readonly port: number;
  /** Files the server reads; the configuration is written into it as `nats.conf` (copied into a container). */
  readonly dir: string;
  /** The configuration text, for where the server sees its files. */
  config(view: NatsNodeView): string;
  /** Credentials of a locked-down server; undefined for an open one. */
  readonly security?: NatsSecurity | undefined;
}

export interface ServerBackend {
  readonly name: string;
  startRedis(): Promise<RedisServer>;
  startNats(options?: NatsOptions): Promise<NatsServer>;
  /**
   * A Redis Cluster of `masters` masters (default 3), each with `replicasPerMaster` replicas (default 0) that are
   * in sync when it resolves; every node has a node timeout of 2 s, after which a replica of a silent master
   * promotes itself.
   */
  startRedisCluster(masters?: number, replicasPerMaster?: number): Promise<RedisCluster>;
  /** A NATS server from a configuration of the caller's (a member of a cluster). */
  startNatsNode(spec: NatsNodeSpec): Promise<NatsServer>;
}
