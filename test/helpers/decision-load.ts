/**
 * Sending decisions from outside, as a client would, and reading every answer: HTTP status, whether it was
 * admitted, its reason, the shed code, and its latency.
 */
import { Agent, request } from 'node:http';

/** One answer of `POST /v1/decisions`, as a client reads it. */
export interface Answer {
  status: number;
  allowed: boolean;
  /** The first result's reason, or `overloaded` for a shed 503, or `error:<text>` when nothing came back. */
  reason: string | undefined;
  remaining: number | undefined;
  limit: number | undefined;
  retryAfter: string | undefined;
  ms: number;
}

/** A connection pool big enough for every concurrent request of a burst (one socket each, no queueing). */
export function burstPool(connections: number): Agent {
  return new Agent({ keepAlive: true, maxSockets: connections });
}

/** POST a JSON body; the status, headers and parsed JSON body. */
function post(
  pool: Agent,
  url: string,
  body: string,
  timeoutMs: number,
): Promise<{ status: number; headers: Record<string, unknown>; json: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: 'POST',
        agent: pool,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        timeout: timeoutMs,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          try {
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              json: JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown,
            });
          } catch (error) {
            reject(error instanceof Error ? error : new Error(String(error)));
          }
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}

export async function decide(
  pool: Agent,
  agentUrl: string,
  body: Record<string, unknown>,
  timeoutMs = 30_000,
): Promise<Answer> {
  const started = performance.now();
  try {
    const r = await post(pool, `${agentUrl}/v1/decisions`, JSON.stringify(body), timeoutMs);
    const json = r.json as {
      allowed?: boolean;
      code?: string;
      results?: { reason?: string; remaining?: number; limit?: number }[];
    };
    const first = json.results?.[0];
    return {
      status: r.status,
      allowed: json.allowed === true,
      reason:
        r.status === 503 && json.code === 'AGT_ERR_OVERLOADED' ? 'overloaded' : (first?.reason ?? json.code),
      remaining: first?.remaining,
      limit: first?.limit,
      retryAfter: typeof r.headers['retry-after'] === 'string' ? r.headers['retry-after'] : undefined,
      ms: performance.now() - started,
    };
  } catch (error) {
    return {
      status: 0,
      allowed: false,
      reason: `error:${error instanceof Error ? error.message : String(error)}`,
      remaining: undefined,
      limit: undefined,
      retryAfter: undefined,
      ms: performance.now() - started,
    };
  }
}

/** How many answers had each reason (`ok` for an ordinary decision, allowed or denied). */
export function byReason(answers: readonly Answer[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of answers) {
    const key = a.reason ?? (a.allowed ? 'ok' : 'denied');
    out[key] = (out[key] ?? 0) + 1;
  }
  return out;
}

/** A value of a Prometheus text exposition (first sample matching `pattern`), 0 when absent. */
export async function metric(agentUrl: string, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`${agentUrl}/metrics`)).text();
  const m = pattern.exec(text);
  return m === null ? 0 : Number(m[1]);
}

/** The sum of every sample of metric `name` (all its label sets) an agent exposes, 0 when absent. */
export async function metricTotal(agentUrl: string, name: string): Promise<number> {
  const text = await (await fetch(`${agentUrl}/metrics`)).text();
  let sum = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm'))) sum += Number(m[1]);
  return sum;
}

/**
 * What an agent's store calls came to, for a failure message: the decide calls by outcome and the breaker's
 * transitions (`decide/timeout`, `decide/circuit_open`, `breaker/open`…), counted since the agent started.
 */
export async function storeOutcomes(agentUrl: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${agentUrl}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(
    /^quotaplane_store_latency_seconds_count\{operation="(\w+)",outcome="(\w+)"\} (\d+)$/gm,
  ))
    out[`${m[1]}/${m[2]}`] = Number(m[3]);
  for (const m of text.matchAll(/^quotaplane_store_breaker_transitions_total\{state="(\w+)"\} (\d+)$/gm))
    out[`breaker/${m[1]}`] = Number(m[2]);
  return out;
}

/** The `p`-quantile (0..1) of numbers, nearest rank. */
export function quantile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))] ?? 0;
}
