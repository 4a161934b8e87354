/**
 * A typed client of the regional agent for services: keep-alive connections, a timeout on every call, and a
 * failure mode of its own for when the agent cannot answer (down, slow, 5xx): `closed` denies, `open` admits,
 * both with `reason: "agent_unreachable"`. Answers the agent refuses (4xx: unknown policy, bad subject…) are
 * programming errors and throw AgentRequestError.
 */
import { Agent, request as httpRequest, type IncomingMessage } from 'node:http';
import {
  DecisionResponse,
  Problem,
  checksOf,
  type CheckResult,
  type DecisionRequest,
} from '../../core/agent-wire.js';

export interface AgentClientOptions {
  /** The agent's base URL, e.g. `http://127.0.0.1:7101`. */
  baseUrl: string;
  /** Longest wait for a decision, connection included. Default 100 ms. */
  timeoutMs?: number;
  /** What to answer when the agent cannot: `closed` (deny, default) or `open` (admit). */
  onUnavailable?: 'closed' | 'open';
  /** Retry hint of a `closed` answer given for an unreachable agent. Default 1000 ms. */
  unavailableRetryAfterMs?: number;
  /** Most sockets kept open to the agent. Default 64. */
  maxSockets?: number;
  /** Told about every call the agent did not answer (for the service's own metrics and logs). */
  onFailure?: (error: Error) => void;
}

/** The agent refused the request (4xx): the problem document says why. */
export class AgentRequestError extends Error {
  readonly status: number;
  readonly problem: Problem;
  readonly code: string;
  constructor(problem: Problem) {
    super(`agent refused the request: ${problem.code} ${problem.detail ?? problem.title}`);
    this.name = 'AgentRequestError';
    this.status = problem.status;
    this.problem = problem;
    this.code = problem.code;
  }
}

class Unavailable extends Error {}

export class AgentClient {
  readonly #url: URL;
  readonly #agent: Agent;
  readonly #timeoutMs: number;
  readonly #open: boolean;
  readonly #retryAfterMs: number;
  readonly #onFailure: ((error: Error) => void) | undefined;

  constructor(options: AgentClientOptions) {
    this.#url = new URL('/v1/decisions', options.baseUrl);
    if (this.#url.protocol !== 'http:')
      throw new TypeError('the agent listens on plain http on a private network');
    this.#timeoutMs = options.timeoutMs ?? 100;
    this.#open = options.onUnavailable === 'open';
    this.#retryAfterMs = options.unavailableRetryAfterMs ?? 1000;
    this.#onFailure = options.onFailure;
    this.#agent = new Agent({ keepAlive: true, maxSockets: options.maxSockets ?? 64, scheduling: 'lifo' });
  }

  /** Ask for a decision. Never throws for an unavailable agent; throws AgentRequestError on a 4xx. */
  async decide(body: DecisionRequest, options: { requestId?: string } = {}): Promise<DecisionResponse> {
    try {
      const { status, text } = await this.#post(JSON.stringify(body), options.requestId);
      if (status === 200) {
        const parsed = DecisionResponse.safeParse(JSON.parse(text));
        if (parsed.success) return parsed.data;
        throw new Unavailable(`unexpected decision body: ${parsed.error.message}`);
      }
      if (status >= 400 && status < 500) {
        const problem = Problem.safeParse(JSON.parse(text));
        if (problem.success) throw new AgentRequestError(problem.data);
      }
      throw new Unavailable(`agent answered ${status}`);
    } catch (error) {
      if (error instanceof AgentRequestError) throw error;
      this.#onFailure?.(error as Error);
      return this.#unavailable(body);
    }
  }

  /** Shorthand for one check. */
  check(policy: string, subject: string, cost?: number): Promise<DecisionResponse> {
    return this.decide(cost === undefined ? { policy, subject } : { policy, subject, cost });
  }

  /** Close the kept-alive sockets. */
  close(): void {
    this.#agent.destroy();
  }

  #post(payload: string, requestId: string | undefined): Promise<{ status: number; text: string }> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string | number> = {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(payload),
      };
      if (requestId !== undefined) headers['x-request-id'] = requestId;
      const req = httpRequest(
        this.#url,
        { method: 'POST', agent: this.#agent, headers },
        (res: IncomingMessage) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            clearTimeout(timer);
            resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') });
          });
          res.on('error', reject);
        },
      );
      const timer = setTimeout(() => {
        req.destroy(new Unavailable(`no answer from the agent within ${this.#timeoutMs} ms`));
      }, this.#timeoutMs);
      req.on('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
      req.end(payload);
    });
  }

  #unavailable(body: DecisionRequest): DecisionResponse {
    const allowed = this.#open;
    const results = checksOf(body).map((c): CheckResult => ({
      policy: c.policy,
      allowed,
      remaining: 0,
      limit: 0,
      resetMs: null,
      retryAfterMs: allowed ? 0 : this.#retryAfterMs,
      // The agent did not say; the client reports the default mode.
      mode: 'regional',
      reason: 'agent_unreachable',
    }));
    const headers: Record<string, string> = allowed
      ? {}
      : { 'Retry-After': String(Math.ceil(this.#retryAfterMs / 1000)) };
    return { allowed, retryAfterMs: allowed ? 0 : this.#retryAfterMs, results, headers };
  }
}
