/**
 * The servers integration tests run against, behind one interface so the backend can change (local processes
 * today; containers when Docker is available) without touching a test.
 */

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
  /** `nats://host:port` */
  readonly url: string;
}

/** A local Redis Cluster of `masters` nodes, no replicas. */
export interface RedisCluster extends AsyncDisposable {
  readonly nodes: readonly RedisServer[];
  stop(): Promise<void>;
}

export interface NatsOptions {
  /** Enable JetStream (with its own storage directory). Default true. */
  jetstream?: boolean;
}

export interface ServerBackend {
  readonly name: string;
  startRedis(): Promise<RedisServer>;
  startNats(options?: NatsOptions): Promise<NatsServer>;
  startRedisCluster(masters?: number): Promise<RedisCluster>;
}
