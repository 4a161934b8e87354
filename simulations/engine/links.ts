/** The link table of a run: local hops inside a region, one spec between regions, and per-pair overrides. */
import { SimConfigError } from '../errors.js';
import type { Settings } from '../settings.js';
import type { LinkSpec } from './network.js';

/**
 * Links among `locations.length` nodes, node i sitting in region `locations[i]` (an index into `regions`).
 * Nodes in one region use the local hop; others the inter-region spec, unless `settings.links` overrides the pair.
 */
export function buildLinks(
  regions: readonly string[],
  locations: readonly number[],
  settings: Settings,
): LinkSpec[][] {
  const local: LinkSpec = { delayMs: settings.localDelayMs, jitterMs: 0, loss: 0 };
  const remote: LinkSpec = {
    delayMs: settings.linkDelayMs,
    jitterMs: settings.linkJitterMs,
    loss: settings.linkLoss,
  };
  const overrides = new Map<string, LinkSpec>();
  for (const entry of settings.links === '' ? [] : settings.links.split(',')) {
    const [pair, spec] = entry.split('=') as [string, string];
    const [a, b] = pair.split('-') as [string, string];
    const [delayMs, jitterMs, loss] = spec.split('/').map(Number) as [number, number, number];
    for (const name of [a, b]) {
      if (!regions.includes(name))
        throw new SimConfigError(
          `links: unknown region ${name} (regions of this run: ${regions.join(', ')})`,
        );
    }
    if (a === b) throw new SimConfigError(`links: ${pair} joins a region to itself`);
    if (!(loss >= 0 && loss <= 1)) throw new SimConfigError(`links: loss of ${pair} must be in [0, 1]`);
    // The pattern of `links` lets `1.2.3` or `.` through, which Number() reads as NaN: a NaN delay scheduled
    // messages at NaN µs, which ended the run early, silently.
    if (!(Number.isFinite(delayMs) && delayMs >= 0 && Number.isFinite(jitterMs) && jitterMs >= 0))
      throw new SimConfigError(`links: delay and jitter of ${pair} must be numbers of ms ≥ 0, got "${spec}"`);
    overrides.set(`${a}-${b}`, { delayMs, jitterMs, loss });
    overrides.set(`${b}-${a}`, { delayMs, jitterMs, loss });
  }
  return locations.map((from) =>
    locations.map((to) =>
      from === to ? local : (overrides.get(`${regions[from]!}-${regions[to]!}`) ?? remote),
    ),
  );
}
