/**
 * What the proxy models share: a loopback HTTP server that answers with a handler, and a call to an upstream
 * that returns status, headers and body (or the error that stood for them).
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Headers by lower-case name. */
export type HeaderMap = Map<string, string>;

export interface ModelRequest {
  method: string;
  /** Path with the query. */
  path: string;
  headers: HeaderMap;
  remoteAddress: string;
}

export interface ModelResponse {
  status: number;
  headers: HeaderMap;
  body: string;
}

export interface ModelServer extends AsyncDisposable {
  readonly url: string;
}

/** Headers of an incoming request, first value of each, by lower-case name. */
export function headerMap(headers: IncomingHttpHeaders): HeaderMap {
  const out: HeaderMap = new Map();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    out.set(name.toLowerCase(), Array.isArray(value) ? value.join(', ') : value);
  }
  return out;
}

/** Serve `handle` on a free loopback port. */
export async function serveModel(
  handle: (request: ModelRequest) => Promise<ModelResponse>,
): Promise<ModelServer> {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      handle({
        method: req.method ?? 'GET',
        path: req.url ?? '/',
        headers: headerMap(req.headers),
        remoteAddress: req.socket.remoteAddress ?? '',
      }).then(
        (answer) => {
          for (const [name, value] of answer.headers) res.setHeader(name, value);
          res.statusCode = answer.status;
          res.end(answer.body);
        },
        (error: unknown) => {
          res.statusCode = 599;
          res.end(String(error));
        },
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    async [Symbol.asyncDispose]() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'host']);

/** Call an upstream; undefined when it could not be reached or did not answer within `timeoutMs`. */
export async function callUpstream(
  url: string,
  method: string,
  headers: HeaderMap,
  timeoutMs = 2000,
): Promise<ModelResponse | undefined> {
  const sent: Record<string, string> = {};
  for (const [name, value] of headers) if (!HOP_BY_HOP.has(name)) sent[name] = value;
  try {
    const res = await fetch(url, { method, headers: sent, signal: AbortSignal.timeout(timeoutMs) });
    const out: HeaderMap = new Map();
    res.headers.forEach((value, name) => {
      if (!HOP_BY_HOP.has(name)) out.set(name, value);
    });
    return { status: res.status, headers: out, body: await res.text() };
  } catch {
    return undefined;
  }
}
