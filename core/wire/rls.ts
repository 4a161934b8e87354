/**
 * Envoy's global rate-limit service on the wire (`proto/envoy/service/ratelimit/v3/rls.proto`), as the agent's
 * gRPC server receives and sends it through `@grpc/proto-loader` (field names as in the proto, enums as
 * strings, 64-bit numbers as numbers). The agent checks every inbound request against `RlsRequest`; the
 * response shape is what the server writes and what clients (tests, the bench) read.
 */
import { z } from 'zod';
import { MAX_CHECKS_PER_REQUEST } from './agent.js';

/** Longest domain or descriptor key the agent accepts. */
export const MAX_RLS_TEXT = 256;
/**
 * Longest descriptor value: Envoy builds values from request headers and the path (with its query), up to its
 * own header limit (`max_request_headers_kb`, 60 KiB by default). A value that cannot name a policy or a subject
 * is refused when a rule uses it, never when no rule matches its descriptor (which is not limited).
 */
export const MAX_RLS_VALUE = 64 * 1024;
/** Most entries one descriptor may carry. */
export const MAX_RLS_ENTRIES = 16;

const Text = z.string().min(1).max(MAX_RLS_TEXT);

/**
 * One (key, value) of a descriptor, e.g. `("tenant", "acme")`. The value may be empty (a header sent empty; proto3
 * leaves an empty string off the wire).
 */
export const RlsEntry = z.object({ key: Text, value: z.string().max(MAX_RLS_VALUE).default('') });
export type RlsEntry = z.infer<typeof RlsEntry>;

/** A descriptor: its entries, in order. A `limit` override may come along; the agent's policies win over it. */
export const RlsDescriptor = z.object({
  entries: z.array(RlsEntry).min(1).max(MAX_RLS_ENTRIES),
  limit: z.unknown().optional(),
});
export type RlsDescriptor = z.infer<typeof RlsDescriptor>;

/** `RateLimitRequest`: the domain, at most 16 descriptors (one decision's checks), and the hits each adds. */
export const RlsRequest = z.object({
  domain: Text,
  descriptors: z.array(RlsDescriptor).min(1).max(MAX_CHECKS_PER_REQUEST),
  /** 0 or absent means 1 (proto3 cannot tell them apart). */
  hits_addend: z.number().int().min(0).max(0xffff_ffff).optional(),
});
export type RlsRequest = z.infer<typeof RlsRequest>;

export const RlsCode = z.enum(['UNKNOWN', 'OK', 'OVER_LIMIT']);
export type RlsCode = z.infer<typeof RlsCode>;

export const RlsUnit = z.enum(['UNKNOWN', 'SECOND', 'MINUTE', 'HOUR', 'DAY', 'MONTH', 'YEAR']);
export type RlsUnit = z.infer<typeof RlsUnit>;

/** `google.protobuf.Duration`. */
export const ProtoDuration = z.object({ seconds: z.number().int().min(0), nanos: z.number().int().min(0) });
export type ProtoDuration = z.infer<typeof ProtoDuration>;

/** `RateLimitResponse.DescriptorStatus`. */
export const RlsDescriptorStatus = z.object({
  code: RlsCode,
  current_limit: z
    .object({ name: z.string(), requests_per_unit: z.number().int().min(0), unit: RlsUnit })
    .optional(),
  limit_remaining: z.number().int().min(0),
  duration_until_reset: ProtoDuration.optional(),
});
export type RlsDescriptorStatus = z.infer<typeof RlsDescriptorStatus>;

/** `envoy.config.core.v3.HeaderValue`. */
export const RlsHeader = z.object({ key: z.string(), value: z.string() });
export type RlsHeader = z.infer<typeof RlsHeader>;

/** `RateLimitResponse`, as the agent answers it. */
export const RlsResponse = z.object({
  overall_code: RlsCode,
  statuses: z.array(RlsDescriptorStatus),
  response_headers_to_add: z.array(RlsHeader),
  /** The problem document of a refusal (UTF-8 JSON); empty when allowed. */
  raw_body: z.instanceof(Uint8Array).optional(),
});
export type RlsResponse = z.infer<typeof RlsResponse>;

/** `ms` as a `google.protobuf.Duration`. */
export function protoDuration(ms: number): ProtoDuration {
  const whole = Math.max(0, Math.round(ms));
  return { seconds: Math.floor(whole / 1000), nanos: (whole % 1000) * 1_000_000 };
}
