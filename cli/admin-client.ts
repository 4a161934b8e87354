/**
 * The coordinator's admin API as the CLI speaks it: bearer token, JSON bodies, ETags, and problem documents
 * with a `COORD_ERR_*` code turned into `AdminApiError`s that carry the API's stable code (any other answer is a
 * `ConnectionError`: whatever answered is not the coordinator's API). Responses are checked against the same zod
 * schemas the coordinator answers with (core/wire/admin.ts).
 */
import type { z } from 'zod';
import { Problem } from '../core/wire/admin.js';

/** The prefix of every code the coordinator's problem documents carry (docs/errors.md). */
const COORDINATOR_CODE_PREFIX = 'COORD_ERR_';

/** The API refused the request: status and the problem document's stable code. */
export class AdminApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly fieldErrors: readonly { path: string; message: string }[];
  constructor(status: number, problem: Problem) {
    super(`${problem.code} (${status}): ${problem.detail}`);
    this.name = 'AdminApiError';
    this.status = status;
    this.code = problem.code;
    this.detail = problem.detail;
    this.fieldErrors = problem.errors ?? [];
  }
}

/** The coordinator could not be reached, or answered something that is not its API. */
export class ConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ConnectionError';
  }
}

export interface AdminAnswer<T> {
  readonly status: number;
  readonly body: T;
  /** The `ETag` header, quotes included (`"7"`), when the answer had one. */
  readonly etag: string | undefined;
}

export interface RequestOptions {
  readonly body?: unknown;
  readonly ifMatch?: string;
  readonly ifNoneMatch?: string;
}

export interface AdminClientOptions {
  readonly url: string;
  readonly token: string | undefined;
  readonly timeoutMs: number;
  readonly fetch?: typeof fetch;
}

export class AdminClient {
  readonly url: string;
  readonly #token: string | undefined;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;

  constructor(options: AdminClientOptions) {
    this.url = options.url.replace(/\/+$/, '');
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs;
    this.#fetch = options.fetch ?? fetch;
  }

  /** One request; throws AdminApiError for a problem answer, ConnectionError when nothing usable came back. */
  async request<T>(
    method: string,
    path: string,
    schema: z.ZodType<T> | undefined,
    options: RequestOptions = {},
  ): Promise<AdminAnswer<T>> {
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.#token !== undefined) headers['authorization'] = `Bearer ${this.#token}`;
    if (options.body !== undefined) headers['content-type'] = 'application/json';
    if (options.ifMatch !== undefined) headers['if-match'] = options.ifMatch;
    if (options.ifNoneMatch !== undefined) headers['if-none-match'] = options.ifNoneMatch;
    let response: Response;
    try {
      response = await this.#fetch(`${this.url}${path}`, {
        method,
        headers,
        body: options.body === undefined ? null : JSON.stringify(options.body),
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
    } catch (error) {
      const why =
        error instanceof Error && error.name === 'TimeoutError'
          ? `no answer within ${this.#timeoutMs} ms`
          : describe(error);
      throw new ConnectionError(`cannot reach the coordinator at ${this.url}: ${why}`, { cause: error });
    }
    const etag = response.headers.get('etag') ?? undefined;
    const text = await response.text();
    const json = text === '' ? undefined : parseJson(text);
    if (response.status >= 400) {
      const problem = Problem.safeParse(json);
      // Only the coordinator's own codes are its API refusing: an agent (or another service speaking RFC 9457)
      // at that URL answers problem documents too, and its code says nothing about the admin API.
      if (problem.success && problem.data.code.startsWith(COORDINATOR_CODE_PREFIX))
        throw new AdminApiError(response.status, problem.data);
      if (problem.success)
        throw new ConnectionError(
          `${method} ${path} answered ${response.status} with ${problem.data.code}, not a coordinator's error code (${COORDINATOR_CODE_PREFIX}*); is ${this.url} a quotaplane coordinator?`,
        );
      throw new ConnectionError(
        `${method} ${path} answered ${response.status} without a problem document; is ${this.url} a quotaplane coordinator?`,
      );
    }
    if (schema === undefined) return { status: response.status, body: undefined as T, etag };
    const parsed = schema.safeParse(json);
    if (!parsed.success) {
      throw new ConnectionError(
        `${method} ${path} answered ${response.status} with a body this CLI does not understand (${parsed.error.issues[0]?.message ?? 'invalid'}); is ${this.url} a quotaplane coordinator of the same version?`,
      );
    }
    return { status: response.status, body: parsed.data, etag };
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    if (cause instanceof Error && 'code' in cause)
      return `${String((cause as { code: unknown }).code)} ${cause.message}`;
    return error.message;
  }
  return String(error);
}
