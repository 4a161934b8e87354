/**
 * The gRPC listener of Envoy's rate-limit service (`@grpc/grpc-js`, plaintext: the agent listens on a private
 * network, as its HTTP side does). The proto is loaded from `proto/` at start.
 */
import { fileURLToPath } from 'node:url';
import type { status as grpcStatus } from '@grpc/grpc-js';
import {
  Server,
  ServerCredentials,
  loadPackageDefinition,
  type ServiceDefinition,
  type ServerUnaryCall,
  type sendUnaryData,
} from '@grpc/grpc-js';
import { loadSync, type Options } from '@grpc/proto-loader';
import type { RlsResponse } from '../../core/wire/rls.js';
import { GrpcStatus, RlsError, type RlsService } from './rls-service.js';

/** Where the `.proto` files live, and the service's file among them. */
export const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
export const RLS_PROTO = 'envoy/service/ratelimit/v3/rls.proto';

/** The loader options both the server and clients use: proto field names, enums as strings, longs as numbers. */
export const PROTO_OPTIONS: Options = {
  includeDirs: [PROTO_DIR],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: false,
  oneofs: true,
};

type Loaded = Record<string, Record<string, Record<string, Record<string, Record<string, unknown>>>>>;

interface LoadedService {
  definition: ServiceDefinition;
  Client: new (address: string, credentials: unknown) => unknown;
}
let loaded: LoadedService | undefined;

/** The `RateLimitService` of the proto (loaded once): its service definition and the client constructor. */
export function rateLimitServiceDefinition(): LoadedService {
  loaded ??= load();
  return loaded;
}

function load(): LoadedService {
  const pkg = loadPackageDefinition(loadSync(RLS_PROTO, PROTO_OPTIONS)) as unknown as Loaded;
  const Client = pkg['envoy']!['service']!['ratelimit']!['v3']!['RateLimitService'] as {
    service: ServiceDefinition;
    new (address: string, credentials: unknown): unknown;
  };
  return { definition: Client.service, Client };
}

export interface RlsListener {
  /** `grpc://host:port` */
  readonly url: string;
  readonly port: number;
  /** Stop taking calls, finish those in flight (cut after `graceMs`). */
  close(graceMs?: number): Promise<void>;
}

/** Listen on `host:port` (0: any free port) and serve `service`. */
export async function listenRls(service: RlsService, host: string, port: number): Promise<RlsListener> {
  const server = new Server();
  const { definition } = rateLimitServiceDefinition();
  server.addService(definition, {
    ShouldRateLimit(call: ServerUnaryCall<unknown, RlsResponse>, callback: sendUnaryData<RlsResponse>) {
      const deadline = call.getDeadline();
      const at = deadline instanceof Date ? deadline.getTime() : deadline;
      const ms = Number.isFinite(at) ? at - Date.now() : Infinity;
      service.shouldRateLimit(call.request, ms).then(
        (response) => callback(null, response),
        (error: unknown) => {
          const e = error instanceof RlsError ? error : new RlsError('INTERNAL', 'internal error');
          callback({ code: GrpcStatus[e.status] as grpcStatus, details: e.message }, null);
        },
      );
    },
  });
  const address = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
  const bound = await new Promise<number>((resolve, reject) =>
    server.bindAsync(address, ServerCredentials.createInsecure(), (error, p) =>
      error ? reject(error) : resolve(p),
    ),
  );
  const shown = host.includes(':') ? `[${host}]` : host;
  return {
    url: `grpc://${shown}:${bound}`,
    port: bound,
    close: (graceMs = 5000) =>
      new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(force);
          resolve();
        });
      }),
  };
}
