/**
 * `POST /v1/decisions` to the agents over kept-alive HTTP/1.1 connections (node:http: a replay sends hundreds of
 * small requests a second and wants each one timed, without a client library's own queueing in between).
 */
import { Agent, request } from 'node:http';
import { DecisionResponse } from '../../core/wire/agent.js';

/** What came back for one decision request. */
export interface DecisionAnswer {
  /** HTTP status; 0 when no answer came. */
  status: number;
  allowed: boolean;
  retryAfterMs: number | null;
  /** The decision's `reason`, when degraded. */
  reason?: string | undefined;
  /** Why there is no decision: a transport error or a problem document's code. */
  error?: string | undefined;
}

const ANSWER_TIMEOUT_MS = 10_000;

export class DecisionClient {
  readonly #targets: { host: string; port: number; agent: Agent }[];

  /** `urls` by region index; at most `maxSockets` requests in flight per agent (more wait for a socket). */
  constructor(urls: readonly string[], maxSockets = 64) {
    this.#targets = urls.map((u) => {
      const url = new URL(u);
      return {
        host: url.hostname,
        port: Number(url.port),
        agent: new Agent({ keepAlive: true, maxSockets }),
      };
    });
  }

  decide(region: number, body: string): Promise<DecisionAnswer> {
    const target = this.#targets[region]!;
    return new Promise((resolve) => {
      let settled = false;
      const done = (answer: DecisionAnswer) => {
        if (settled) return;
        settled = true;
        resolve(answer);
      };
      const failed = (error: string) => done({ status: 0, allowed: false, retryAfterMs: null, error });
      const req = request(
        {
          host: target.host,
          port: target.port,
          path: '/v1/decisions',
          method: 'POST',
          agent: target.agent,
          headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', (e) => failed(e.message));
          res.on('end', () => done(parseAnswer(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
        },
      );
      req.setTimeout(ANSWER_TIMEOUT_MS, () => req.destroy(new Error(`no answer in ${ANSWER_TIMEOUT_MS} ms`)));
      req.on('error', (e) => failed((e as NodeJS.ErrnoException).code ?? e.message));
      req.end(body);
    });
  }

  close(): void {
    for (const t of this.#targets) t.agent.destroy();
  }
}

function parseAnswer(status: number, text: string): DecisionAnswer {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { status, allowed: false, retryAfterMs: null, error: 'unreadable answer' };
  }
  if (status !== 200) {
    const code = (json as { code?: unknown } | null)?.code;
    return {
      status,
      allowed: false,
      retryAfterMs: null,
      error: typeof code === 'string' ? code : `http_${status}`,
    };
  }
  const parsed = DecisionResponse.safeParse(json);
  if (!parsed.success) return { status: 0, allowed: false, retryAfterMs: null, error: 'not a decision' };
  return {
    status,
    allowed: parsed.data.allowed,
    retryAfterMs: parsed.data.retryAfterMs,
    reason: parsed.data.results.find((r) => r.reason !== undefined)?.reason,
  };
}
