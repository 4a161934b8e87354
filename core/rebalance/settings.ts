import { z } from 'zod';

/**
 * How the coordinator moves shares. The defaults converge within 10 s of a shift of 80% of the demand to another
 * region and leave shares alone under stationary noisy demand (both are tests in test/unit/core/rebalance/rebalance-*.test.ts).
 */
export const RebalanceSettings = z.strictObject({
  /** How often the coordinator recomputes targets, ms. */
  roundMs: z.number().int().min(50).max(60_000).default(1000),
  /** Half-life of the exponentially smoothed demand per region, ms: shorter reacts faster, longer ignores noise. */
  demandHalfLifeMs: z.number().int().min(1).max(600_000).default(2000),
  /** Fraction of the distance to the target covered per step, (0, 1]. */
  damping: z.number().gt(0).max(1).default(0.85),
  /**
   * Largest shrink of any region's share in one step, (0, 1] (a grow takes what the shrinks free, so a step hands
   * out the whole budget: it can exceed this when several regions shrink at once). A shrink clips the stored burst of every bucket in
   * the region it shrinks; in small steps the growing region's borrowing takes that stock over (its buckets grow
   * a step at a time and its top-ups fetch from the shrinking region) before the next step clips it. At 0.05 a
   * shift of 80% of the demand moves the shares in about 15 rounds, and the admissions never leave 10% of the
   * ideal bucket's on the way; one step of 85% of the gap cost 10 to 17% of single 5 s windows at the move
   * (docs/simulations.md, "Step size").
   */
  maxStep: z.number().gt(0).max(1).default(0.05),
  /**
   * A rebalance starts only when some region's target differs from its share by at least this much (absolute
   * share), so noise does not move shares…
   */
  hysteresis: z.number().min(0).max(0.5).default(0.08),
  /** …and once started, it keeps stepping until every region is within this much of its target. */
  settleBand: z.number().min(0).max(0.5).default(0.02),
  /**
   * Time hysteresis: a rebalance at rest starts only once the target has stayed beyond the hysteresis band for
   * this long, ms, so skewed reports as demand resumes, a noise spike or demand that keeps moving (following the
   * sun) moves nothing. A minute by default: borrowing serves a subject wherever its traffic is at once, and a
   * move is worth its cost (a shrink clamps the stored burst of every bucket in the region it shrinks) only for
   * a split of demand that lasts (docs/simulations.md, "Demand settings"). 0 starts at the first round beyond.
   */
  confirmMs: z.number().int().min(0).max(600_000).default(60_000),
  /**
   * A rebalance at rest starts only when a region it would grow is short of room: its unmet demand (refused
   * within the subjects' own limits) is at least this fraction of its demand. Where every region is served,
   * no region is shrunk (its stored burst stays), however the demand is spread. 0 turns the gate off.
   */
  unmetFraction: z.number().min(0).max(1).default(0.05),
  /** Floor of every region's share when a policy sets no `minShare`. */
  defaultMinShare: z.number().min(0).max(1).default(0.02),
});
export type RebalanceSettings = z.output<typeof RebalanceSettings>;
export type RebalanceSettingsInput = z.input<typeof RebalanceSettings>;

/** The defaults, parsed. */
export const defaultRebalanceSettings: RebalanceSettings = RebalanceSettings.parse({});
