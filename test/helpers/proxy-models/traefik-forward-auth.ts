/**
 * A model of Traefik (v2/v3) running a dynamic configuration, for the middlewares quotaplane's docs use, as
 * Traefik documents them:
 * - `headers.customRequestHeaders`: set each header; an empty value removes it.
 * - `basicAuth`: 401 without valid credentials; `headerField` receives the user name; `removeHeader` drops
 *   `Authorization`. (The model takes the users from the test instead of `usersFile`.)
 * - `forwardAuth`: GET `address` with the request's headers (only `authRequestHeaders` when set) and Traefik's
 *   `X-Forwarded-Method`, `-Proto`, `-Host`, `-Uri`, `-For`; a 2xx lets the request through with the
 *   `authResponseHeaders` of the answer copied onto it; any other answer is returned to the client as it is
 *   (status, headers, body); an auth server that cannot be reached is a 500.
 * Routers match `PathPrefix(...)` rules; services forward to their first server.
 */
import {
  callUpstream,
  serveModel,
  type HeaderMap,
  type ModelResponse,
  type ModelServer,
} from './model-server.js';

interface Middleware {
  headers?: { customRequestHeaders?: Record<string, string> };
  basicAuth?: { headerField?: string; removeHeader?: boolean };
  forwardAuth?: { address: string; authRequestHeaders?: string[]; authResponseHeaders?: string[] };
}

interface Dynamic {
  http: {
    routers: Record<string, { rule: string; middlewares?: string[]; service: string }>;
    middlewares: Record<string, Middleware>;
    services: Record<string, { loadBalancer: { servers: { url: string }[] } }>;
  };
}

const answer = (status: number, body = '', headers: HeaderMap = new Map()): ModelResponse => ({
  status,
  headers,
  body,
});

/** Serve `dynamic` (the parsed YAML) on a loopback port; `users` maps user names to passwords. */
export function startTraefikModel(
  dynamic: unknown,
  users: Readonly<Record<string, string>>,
): Promise<ModelServer> {
  const config = dynamic as Dynamic;
  const routers = Object.values(config.http.routers).map((r) => ({
    ...r,
    prefix: /PathPrefix\(`([^`]+)`\)/.exec(r.rule)![1]!,
  }));
  return serveModel(async (request) => {
    const router = routers.find((r) => request.path.startsWith(r.prefix));
    if (router === undefined) return answer(404, '404 page not found\n');
    const headers = new Map(request.headers);
    for (const name of router.middlewares ?? []) {
      const m = config.http.middlewares[name];
      if (m === undefined) throw new Error(`no middleware ${name}`);
      for (const [header, value] of Object.entries(m.headers?.customRequestHeaders ?? {})) {
        if (value === '') headers.delete(header.toLowerCase());
        else headers.set(header.toLowerCase(), value);
      }
      if (m.basicAuth !== undefined) {
        const sent = /^Basic (.+)$/.exec(headers.get('authorization') ?? '')?.[1];
        const [user, password] = Buffer.from(sent ?? '', 'base64')
          .toString()
          .split(':');
        if (user === undefined || users[user] === undefined || users[user] !== password) {
          return answer(401, '401 Unauthorized\n', new Map([['www-authenticate', 'Basic realm="traefik"']]));
        }
        if (m.basicAuth.headerField !== undefined) headers.set(m.basicAuth.headerField.toLowerCase(), user);
        if (m.basicAuth.removeHeader === true) headers.delete('authorization');
      }
      if (m.forwardAuth !== undefined) {
        const fa = m.forwardAuth;
        const authHeaders: HeaderMap = new Map();
        for (const [header, value] of headers) {
          const listed = fa.authRequestHeaders?.some((h) => h.toLowerCase() === header) ?? true;
          if (listed) authHeaders.set(header, value);
        }
        authHeaders.set('x-forwarded-method', request.method);
        authHeaders.set('x-forwarded-proto', 'http');
        authHeaders.set('x-forwarded-host', headers.get('host') ?? '');
        authHeaders.set('x-forwarded-uri', request.path);
        authHeaders.set('x-forwarded-for', request.remoteAddress.replace(/^::ffff:/, ''));
        const auth = await callUpstream(fa.address, 'GET', authHeaders);
        if (auth === undefined) return answer(500, 'Internal Server Error');
        if (auth.status < 200 || auth.status >= 300) return auth;
        for (const header of fa.authResponseHeaders ?? []) {
          const value = auth.headers.get(header.toLowerCase());
          if (value !== undefined) headers.set(header.toLowerCase(), value);
        }
      }
    }
    const server = config.http.services[router.service]!.loadBalancer.servers[0]!.url;
    return (
      (await callUpstream(`${server}${request.path}`, request.method, headers)) ?? answer(502, 'Bad Gateway')
    );
  });
}
