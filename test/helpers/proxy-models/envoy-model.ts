/**
 * A model of Envoy running a static bootstrap, for the HTTP filters quotaplane's docs use, as Envoy documents
 * them (and as its `ext_authz` HTTP client, `raw_http_client_impl.cc`, implements them):
 * - `header_mutation`: the filter's `request_mutations`, then the route's (`typed_per_filter_config` under the
 *   filter's name): `remove`, and `append` with `OVERWRITE_IF_EXISTS_OR_ADD` or `APPEND_IF_EXISTS_OR_ADD`.
 * - `jwt_authn`: 401 without a bearer JWT; `claim_to_headers` copies claims into headers; the token is removed
 *   (`forward: false`). The model reads the claims without checking the signature.
 * - `ext_authz` (HTTP service): the original method to `path_prefix` + the original path, with `Host`,
 *   `Authorization`, the `allowed_headers` of the request and `headers_to_add`. 200 allows and adds
 *   `allowed_client_headers_on_success` to the client's response; a 5xx, or no answer within the timeout, is an
 *   error: `status_on_error` (403 by default) with an empty body, unless `failure_mode_allow`; any other status
 *   denies with that status and body and the `allowed_client_headers` (all but `Host` when unset).
 * - `ratelimit` (the global rate-limit service over gRPC): each of the route's `rate_limits` builds one
 *   descriptor from its actions (`generic_key`, `request_headers`, `remote_address`; a descriptor whose header is
 *   absent is not sent), and one `ShouldRateLimit` call carries them within `timeout` (20 ms unless set).
 *   `OK` lets the request through and adds `response_headers_to_add` to its response; `OVER_LIMIT` answers
 *   `rate_limited_status` (429) with those headers, `x-envoy-ratelimited: true` and `raw_body`; an error or no
 *   answer lets the request through, or with `failure_mode_deny` answers `status_on_error` (500 unless set).
 * - `router`: the route's cluster, by prefix match.
 */
import { rlsClient, type RlsCall, type RlsClient } from '../../../regional-agent/grpc/rls-client.js';
import {
  callUpstream,
  serveModel,
  type HeaderMap,
  type ModelResponse,
  type ModelServer,
} from './model-server.js';

interface Mutation {
  remove?: string;
  append?: { header: { key: string; value: string }; append_action?: string };
}
interface Filter {
  name: string;
  typed_config: Record<string, unknown> & { '@type': string };
}
interface RateLimitAction {
  generic_key?: { descriptor_value: string; descriptor_key?: string };
  request_headers?: { header_name: string; descriptor_key: string };
  remote_address?: Record<string, never>;
}
interface RateLimitFilter {
  domain: string;
  timeout?: string;
  failure_mode_deny?: boolean;
  status_on_error?: { code: string };
  rate_limited_status?: { code: string };
  rate_limit_service: { grpc_service: { envoy_grpc: { cluster_name: string } } };
}
interface Route {
  match: { prefix: string };
  route: { cluster: string; rate_limits?: { actions: RateLimitAction[] }[] };
  typed_per_filter_config?: Record<string, { mutations?: { request_mutations?: Mutation[] } }>;
}
interface Cluster {
  name: string;
  load_assignment: {
    endpoints: {
      lb_endpoints: { endpoint: { address: { socket_address: { address: string; port_value: number } } } }[];
    }[];
  };
}
interface Bootstrap {
  static_resources: {
    listeners: { filter_chains: { filters: { typed_config: Record<string, unknown> }[] }[] }[];
    clusters: Cluster[];
  };
}
interface ExtAuthz {
  failure_mode_allow?: boolean;
  status_on_error?: { code: string };
  http_service: {
    server_uri: { cluster: string; timeout: string };
    path_prefix?: string;
    authorization_request?: {
      allowed_headers?: { patterns: { exact: string }[] };
      headers_to_add?: { key: string; value: string }[];
    };
    authorization_response?: {
      allowed_client_headers?: { patterns: { exact: string }[] };
      allowed_client_headers_on_success?: { patterns: { exact: string }[] };
    };
  };
}

const STATUS: Record<string, number> = {
  Forbidden: 403,
  ServiceUnavailable: 503,
  TooManyRequests: 429,
  InternalServerError: 500,
};
const ALWAYS_TO_CLIENT = ['content-length', 'www-authenticate', 'location'];

const typeOf = (f: Filter) => f.typed_config['@type'].split('.').at(-1);
const exacts = (list: { patterns: { exact: string }[] } | undefined) =>
  list === undefined ? undefined : list.patterns.map((p) => p.exact.toLowerCase());

function mutate(headers: HeaderMap, mutations: Mutation[] | undefined): void {
  for (const m of mutations ?? []) {
    if (m.remove !== undefined) headers.delete(m.remove.toLowerCase());
    if (m.append !== undefined) {
      const key = m.append.header.key.toLowerCase();
      const before = headers.get(key);
      const append = m.append.append_action === 'APPEND_IF_EXISTS_OR_ADD' && before !== undefined;
      headers.set(key, append ? `${before},${m.append.header.value}` : m.append.header.value);
    }
  }
}

/** Serve the bootstrap (the parsed YAML) on a loopback port, in place of its listener's address. */
export async function startEnvoyModel(bootstrap: unknown): Promise<ModelServer> {
  const config = bootstrap as Bootstrap;
  const hcm = config.static_resources.listeners[0]!.filter_chains[0]!.filters[0]!.typed_config as {
    route_config: { virtual_hosts: { routes: Route[] }[] };
    http_filters: Filter[];
  };
  const routes = hcm.route_config.virtual_hosts[0]!.routes;
  const clusterUrl = (name: string) => {
    const c = config.static_resources.clusters.find((x) => x.name === name);
    if (c === undefined) throw new Error(`no cluster ${name}`);
    const a = c.load_assignment.endpoints[0]!.lb_endpoints[0]!.endpoint.address.socket_address;
    return `http://${a.address}:${a.port_value}`;
  };
  // One HTTP/2 connection per gRPC cluster, as Envoy keeps.
  const grpcClients = new Map<string, RlsClient>();
  const grpcClient = (name: string) => {
    let client = grpcClients.get(name);
    if (client === undefined) {
      client = rlsClient(clusterUrl(name).replace(/^http:\/\//, ''));
      grpcClients.set(name, client);
    }
    return client;
  };
  const answer = (status: number, body = '', headers: HeaderMap = new Map()): ModelResponse => ({
    status,
    headers,
    body,
  });

  // Envoy keeps its gRPC connections open: the model connects before it serves.
  for (const filter of hcm.http_filters) {
    if (typeOf(filter) !== 'RateLimit') continue;
    const rl = filter.typed_config as unknown as RateLimitFilter;
    await grpcClient(rl.rate_limit_service.grpc_service.envoy_grpc.cluster_name).ready();
  }
  const server = await serveModel(async (request) => {
    const route = routes.find((r) => request.path.startsWith(r.match.prefix));
    if (route === undefined) return answer(404);
    const headers = new Map(request.headers);
    const onSuccess: HeaderMap = new Map();
    for (const filter of hcm.http_filters) {
      const type = typeOf(filter);
      if (type === 'HeaderMutation') {
        const own = filter.typed_config['mutations'] as { request_mutations?: Mutation[] } | undefined;
        mutate(headers, own?.request_mutations);
        mutate(headers, route.typed_per_filter_config?.[filter.name]?.mutations?.request_mutations);
      } else if (type === 'JwtAuthentication') {
        const providers = filter.typed_config['providers'] as Record<
          string,
          { claim_to_headers?: { header_name: string; claim_name: string }[] }
        >;
        const token = /^Bearer (.+)$/.exec(headers.get('authorization') ?? '')?.[1];
        const payload = token?.split('.')[1];
        if (payload === undefined) return answer(401, 'Jwt is missing');
        const claims = JSON.parse(Buffer.from(payload, 'base64url').toString()) as Record<string, unknown>;
        for (const provider of Object.values(providers)) {
          for (const c of provider.claim_to_headers ?? []) {
            const value = claims[c.claim_name];
            if (typeof value === 'string') headers.set(c.header_name.toLowerCase(), value);
          }
        }
        headers.delete('authorization');
      } else if (type === 'ExtAuthz') {
        const ext = filter.typed_config as unknown as ExtAuthz;
        const service = ext.http_service;
        const sent: HeaderMap = new Map();
        for (const name of ['host', 'authorization']) {
          const value = headers.get(name);
          if (value !== undefined) sent.set(name, value);
        }
        for (const name of exacts(service.authorization_request?.allowed_headers) ?? []) {
          const value = headers.get(name);
          if (value !== undefined) sent.set(name, value);
        }
        for (const h of service.authorization_request?.headers_to_add ?? [])
          sent.set(h.key.toLowerCase(), h.value);
        const timeoutMs = Number(service.server_uri.timeout.replace(/s$/, '')) * 1000;
        const url = `${clusterUrl(service.server_uri.cluster)}${service.path_prefix ?? ''}${request.path}`;
        const auth = await callUpstream(url, request.method, sent, timeoutMs);
        if (auth === undefined || auth.status >= 500) {
          if (ext.failure_mode_allow === true) continue;
          return answer(STATUS[ext.status_on_error?.code ?? 'Forbidden'] ?? 403);
        }
        const response = service.authorization_response;
        if (auth.status === 200) {
          for (const name of exacts(response?.allowed_client_headers_on_success) ?? []) {
            const value = auth.headers.get(name);
            if (value !== undefined) onSuccess.set(name, value);
          }
          continue;
        }
        const allowed = exacts(response?.allowed_client_headers);
        const toClient: HeaderMap = new Map();
        for (const [name, value] of auth.headers) {
          if (
            allowed === undefined
              ? name !== 'host'
              : allowed.includes(name) || ALWAYS_TO_CLIENT.includes(name)
          )
            toClient.set(name, value);
        }
        return answer(auth.status, auth.body, toClient);
      } else if (type === 'RateLimit') {
        const rl = filter.typed_config as unknown as RateLimitFilter;
        const descriptors: RlsCall['descriptors'] = [];
        for (const limit of route.route.rate_limits ?? []) {
          const entries: { key: string; value: string }[] = [];
          let complete = true;
          for (const action of limit.actions) {
            if (action.generic_key !== undefined) {
              const g = action.generic_key;
              entries.push({ key: g.descriptor_key ?? 'generic_key', value: g.descriptor_value });
            } else if (action.request_headers !== undefined) {
              const value = headers.get(action.request_headers.header_name.toLowerCase());
              if (value === undefined) complete = false;
              else entries.push({ key: action.request_headers.descriptor_key, value });
            } else if (action.remote_address !== undefined) {
              entries.push({ key: 'remote_address', value: request.remoteAddress.replace(/^::ffff:/, '') });
            }
          }
          if (complete) descriptors.push({ entries });
        }
        if (descriptors.length === 0) continue;
        const timeoutMs = Number((rl.timeout ?? '0.02s').replace(/s$/, '')) * 1000;
        const client = grpcClient(rl.rate_limit_service.grpc_service.envoy_grpc.cluster_name);
        try {
          const r = await client.shouldRateLimit({ domain: rl.domain, descriptors }, timeoutMs);
          const added: HeaderMap = new Map(
            r.response_headers_to_add.map((h) => [h.key.toLowerCase(), h.value]),
          );
          if (r.overall_code === 'OVER_LIMIT') {
            added.set('x-envoy-ratelimited', 'true');
            const body = r.raw_body === undefined ? '' : Buffer.from(r.raw_body).toString();
            return answer(STATUS[rl.rate_limited_status?.code ?? 'TooManyRequests'] ?? 429, body, added);
          }
          for (const [name, value] of added) onSuccess.set(name, value);
        } catch {
          if (rl.failure_mode_deny === true)
            return answer(STATUS[rl.status_on_error?.code ?? 'InternalServerError'] ?? 500);
        }
      } else if (type === 'Router') {
        const upstream = await callUpstream(
          `${clusterUrl(route.route.cluster)}${request.path}`,
          request.method,
          headers,
        );
        if (upstream === undefined) return answer(503, 'no healthy upstream');
        for (const [name, value] of onSuccess) upstream.headers.set(name, value);
        return upstream;
      } else {
        throw new Error(`the Envoy model does not know the filter ${filter.typed_config['@type']}`);
      }
    }
    return answer(404);
  });
  return {
    url: server.url,
    async [Symbol.asyncDispose]() {
      for (const client of grpcClients.values()) client.close();
      await server[Symbol.asyncDispose]();
    },
  };
}
