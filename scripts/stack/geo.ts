/**
 * The geo topology's wiring, shared by `npm start -- --geo` (launcher.ts) and the test harness
 * (test/helpers/geo-topology.ts): one NATS server per region in one cluster, each server's routes to the others
 * dialled through a delaying proxy of that pair, and the proxies' specification.
 */
import type { ClusterOptions } from '../../coordinator/nats/credentials.js';
import { roundTripOf, type RoundTrips } from '../../core/distance.js';
import type { ProxySpec } from '../../test/helpers/tcp-proxy.js';

/** The cluster's name: every server of the topology is in it. */
export const GEO_CLUSTER = 'quotaplane';

/**
 * What each server advertises as its route address: one where nothing listens. A server that hears of a peer
 * through gossip before its own configured route (through a proxy) reaches it dials the advertised address
 * directly, around the proxy (seen with nats-server 2.9.10; `no_advertise` stops client URLs only). This way
 * that implicit route is refused and the configured one, through the proxy, is the only way in. A deployment
 * whose servers route to each other directly advertises their real addresses.
 */
export const NO_ROUTE = '127.0.0.1:1';

/** The link that `from`'s server dials to reach `to`'s. */
export function linkName(from: string, to: string): string {
  return `${from}>${to}`;
}

/** The NATS server name of a region's server. */
export function geoServerName(region: string): string {
  return `qp-${region}`;
}

/** How `region`'s server joins the cluster: its route port, and one route to each other region's link. */
export function geoCluster(
  host: string,
  region: string,
  regions: readonly string[],
  routePort: number,
  linkPort: (from: string, to: string) => number,
): ClusterOptions {
  return {
    name: GEO_CLUSTER,
    host,
    port: routePort,
    routes: regions.filter((to) => to !== region).map((to) => `nats-route://${host}:${linkPort(region, to)}`),
    noAdvertise: true,
    advertise: NO_ROUTE,
  };
}

/**
 * The proxies of the topology: for each ordered pair, a link to the route port of `to`, half the pair's round
 * trip each way. Both directions of a pair get the same delay: each server dials the other, and the cluster
 * keeps one of the two routes, whichever it is.
 */
export function geoProxySpec(options: {
  host: string;
  regions: readonly string[];
  roundTrips: RoundTrips;
  jitter: number;
  routePort: (region: string) => number;
  /** The port of each link (0: any free one). */
  linkPort?: (from: string, to: string) => number;
  controlPort?: number;
}): ProxySpec {
  const { host, regions, roundTrips, jitter } = options;
  return {
    control: options.controlPort ?? 0,
    links: regions.flatMap((from) =>
      regions
        .filter((to) => to !== from)
        .map((to) => {
          const rtt = roundTripOf(roundTrips, from, to);
          if (rtt === undefined) throw new Error(`no round trip between ${from} and ${to}`);
          return {
            name: linkName(from, to),
            port: options.linkPort?.(from, to) ?? 0,
            target: { host, port: options.routePort(to) },
            delayMs: rtt / 2,
            jitter,
            between: [from, to] as [string, string],
          };
        }),
    ),
  };
}
