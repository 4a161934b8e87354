/**
 * A client of the agent's rate-limit service, as Envoy calls it: for the smoke check, the tests and the bench
 * (Envoy and Istio bring their own).
 */
import type { Client as GrpcClient } from '@grpc/grpc-js';
import { credentials, type ServiceError } from '@grpc/grpc-js';
import type { RlsResponse } from '../../core/wire/rls.js';
import { rateLimitServiceDefinition } from './rls-server.js';

/** What a caller sends: the proto's field names. */
export interface RlsCall {
  domain: string;
  descriptors: { entries: { key: string; value: string }[] }[];
  hits_addend?: number;
}

type Unary = (
  request: RlsCall,
  options: { deadline: number },
  callback: (error: ServiceError | null, response?: RlsResponse) => void,
) => void;

export interface RlsClient {
  /** One `ShouldRateLimit` call; rejects with the gRPC `ServiceError` (its `code`, `details`) on a status. */
  shouldRateLimit(request: RlsCall, timeoutMs?: number): Promise<RlsResponse>;
  /** Resolves once the connection is up (rejects after `timeoutMs`): a proxy's connection pool is warm. */
  ready(timeoutMs?: number): Promise<void>;
  close(): void;
}

/** Connect to `grpc://host:port` (or `host:port`). */
export function rlsClient(url: string): RlsClient {
  const target = url.replace(/^grpc:\/\//, '');
  const { Client } = rateLimitServiceDefinition();
  const client = new Client(target, credentials.createInsecure()) as GrpcClient & { ShouldRateLimit: Unary };
  return {
    shouldRateLimit: (request, timeoutMs = 1000) =>
      new Promise((resolve, reject) => {
        client.ShouldRateLimit(request, { deadline: Date.now() + timeoutMs }, (error, response) => {
          if (error !== null) reject(error);
          else resolve(response!);
        });
      }),
    ready: (timeoutMs = 5000) =>
      new Promise((resolve, reject) => {
        client.waitForReady(Date.now() + timeoutMs, (error) =>
          error === undefined ? resolve() : reject(error),
        );
      }),
    close: () => client.close(),
  };
}
