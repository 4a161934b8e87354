/**
 * Distance between regions: a matrix of round trips (ms) by pair of regions, written `us-eu=70,us-ap=150` (a
 * pair's order does not matter; a region's round trip to itself is 0). The local stack's geo topology puts its
 * proxies at these round trips, the simulator gives its links the same ones, and an agent derives its timings
 * from its round trips to the other regions (docs/protocol.md, "Timings at a distance").
 */
import { z } from 'zod';
import { RegionName } from './policy/policy.js';

/** The default matrix: an ordinary spread of three regions (us, eu, ap). */
export const DEFAULT_ROUND_TRIPS = 'us-eu=70,us-ap=150,eu-ap=220';
/** Default jitter of a link: each chunk's one-way delay varies within ± this fraction. */
export const DEFAULT_LINK_JITTER = 0.1;
/**
 * The round trip assumed to a region neither the matrix names nor any answer has measured yet, ms: a little more
 * than the default matrix's longest (220), so an agent started without `QP_ROUND_TRIPS` gives its first checks
 * forwarded to a far home the time the link needs; the first answer replaces it.
 */
export const UNMEASURED_ROUND_TRIP_MS = 250;
/** Longest round trip a matrix may name, ms. */
export const MAX_ROUND_TRIP_MS = 10_000;

/** Round trips by unordered pair; the key is the two names sorted and joined by a space. */
export type RoundTrips = ReadonlyMap<string, number>;

function pairKey(a: string, b: string): string {
  return a < b ? `${a} ${b}` : `${b} ${a}`;
}

/** The pairs of regions a key joins, in key order. */
export function pairOf(key: string): [string, string] {
  const [a, b] = key.split(' ') as [string, string];
  return [a, b];
}

/**
 * `a-b` split into two region names. Region names may hold `-` themselves: the split is the one that leaves
 * two names of `known` (when given) or two valid names, and must be the only one.
 */
function splitPair(pair: string, known: readonly string[] | undefined): [string, string] | string {
  const splits: [string, string][] = [];
  for (let i = pair.indexOf('-'); i > 0; i = pair.indexOf('-', i + 1)) {
    const a = pair.slice(0, i);
    const b = pair.slice(i + 1);
    const ok = (name: string) =>
      known !== undefined ? known.includes(name) : RegionName.safeParse(name).success;
    if (ok(a) && ok(b)) splits.push([a, b]);
  }
  if (splits.length === 1) return splits[0]!;
  if (splits.length === 0) {
    return known !== undefined
      ? `${pair} does not join two of the regions ${known.join(', ')}`
      : `${pair} is not two region names joined by -`;
  }
  return `${pair} can be read more than one way`;
}

/**
 * Parse `us-eu=70,us-ap=150,eu-ap=220`. With `regions`, every name must be one of them; a pair given twice, a
 * region paired with itself or a round trip outside [0, MAX_ROUND_TRIP_MS] is refused. Returns the matrix, or
 * the problems found (every one).
 */
export function parseRoundTrips(
  text: string,
  regions?: readonly string[],
): { ok: true; roundTrips: RoundTrips } | { ok: false; problems: string[] } {
  const out = new Map<string, number>();
  const problems: string[] = [];
  for (const entry of text.split(',').map((s) => s.trim())) {
    if (entry === '') continue;
    const at = entry.indexOf('=');
    if (at < 0) {
      problems.push(`${entry}: write A-B=MS`);
      continue;
    }
    const pair = splitPair(entry.slice(0, at).trim(), regions);
    if (typeof pair === 'string') {
      problems.push(pair);
      continue;
    }
    const [a, b] = pair;
    const ms = Number(entry.slice(at + 1).trim());
    if (a === b) problems.push(`${a}-${b}: a region's round trip to itself is 0`);
    else if (!(Number.isFinite(ms) && ms >= 0 && ms <= MAX_ROUND_TRIP_MS))
      problems.push(`${a}-${b}: the round trip is a number of ms in [0, ${MAX_ROUND_TRIP_MS}]`);
    else if (out.has(pairKey(a, b))) problems.push(`${a}-${b} is given twice`);
    else out.set(pairKey(a, b), ms);
  }
  return problems.length === 0 ? { ok: true, roundTrips: out } : { ok: false, problems };
}

/** A zod field for a round-trip matrix written as text (`us-eu=70,…`); empty: no distances. */
export const RoundTripsText = z.string().transform((text, ctx): RoundTrips => {
  const parsed = parseRoundTrips(text);
  if (parsed.ok) return parsed.roundTrips;
  for (const message of parsed.problems) ctx.addIssue({ code: 'custom', message });
  return z.NEVER;
});

/** The round trip between two regions, ms: 0 within a region, undefined for a pair the matrix does not name. */
export function roundTripOf(roundTrips: RoundTrips, a: string, b: string): number | undefined {
  return a === b ? 0 : roundTrips.get(pairKey(a, b));
}

/** Every pair of `regions` the matrix lacks, as `a-b`. */
export function missingPairs(roundTrips: RoundTrips, regions: readonly string[]): string[] {
  const out: string[] = [];
  regions.forEach((a, i) => {
    for (const b of regions.slice(i + 1)) if (!roundTrips.has(pairKey(a, b))) out.push(`${a}-${b}`);
  });
  return out;
}

/** The matrix written back as text, pairs in the order of `regions`. */
export function formatRoundTrips(roundTrips: RoundTrips, regions: readonly string[]): string {
  const out: string[] = [];
  regions.forEach((a, i) => {
    for (const b of regions.slice(i + 1)) {
      const ms = roundTrips.get(pairKey(a, b));
      if (ms !== undefined) out.push(`${a}-${b}=${ms}`);
    }
  });
  return out.join(',');
}

/**
 * What a link's round trip is worth when a wait must cover it: the round trip and a quarter more (the jitter of
 * an ordinary WAN link, ±10 %, and the queueing of a burst). docs/protocol.md, "Timings at a distance".
 */
export const LINK_MARGIN = 0.25;

/** Time to allow for a round trip of `roundTripMs` on top of a wait's local part, ms (whole). */
export function linkAllowanceMs(roundTripMs: number): number {
  return roundTripMs > 0 ? Math.ceil(roundTripMs * (1 + LINK_MARGIN)) : 0;
}

/** Time to allow for one way of a round trip of `roundTripMs` (an answer travelling back), ms (whole). */
export function oneWayAllowanceMs(roundTripMs: number): number {
  return roundTripMs > 0 ? Math.ceil((roundTripMs / 2) * (1 + LINK_MARGIN)) : 0;
}

/**
 * Why a report interval cannot carry lease renewals across a round trip of `roundTripMs`, or undefined when it
 * can: an agent ignores a renewal that comes back later than one interval after its heartbeat, so a coordinator
 * whose region is that far away renews nothing (the lease lapses to the safe share).
 */
export function reportIntervalProblem(reportIntervalMs: number, roundTripMs: number): string | undefined {
  const needed = linkAllowanceMs(roundTripMs);
  if (reportIntervalMs >= needed) return undefined;
  return (
    `the report interval (${reportIntervalMs} ms) is shorter than 1.25 round trips to the farthest region ` +
    `(${needed} ms for ${roundTripMs} ms): renewals from a coordinator that far come back after the interval and ` +
    `are ignored; raise QP_REPORT_INTERVAL_MS to at least ${needed}`
  );
}

/** The longest round trip from `region` to any region the matrix names with it, ms (0: none). */
export function farthestRoundTrip(roundTrips: RoundTrips, region: string): number {
  let most = 0;
  for (const [key, ms] of roundTrips) if (pairOf(key).includes(region)) most = Math.max(most, ms);
  return most;
}
