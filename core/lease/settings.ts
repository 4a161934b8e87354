import { z } from 'zod';

/** Lease timing and override limits of the conservation protocol. */
export const LeaseSettings = z
  .strictObject({
    /** How long a renewal lasts, measured from when the agent sent its heartbeat, ms. */
    leaseMs: z.number().int().min(100).max(600_000).default(6000),
    /** After expiry an agent keeps min(share, safe share) for this long, then settles at the safe share, ms. */
    graceMs: z.number().int().min(100).max(3_600_000).default(12_000),
    /** Margin for clocks that run at different rates: the coordinator counts a lease this much longer, ms. */
    skewMs: z.number().int().min(0).max(60_000).default(1000),
    /** How often agents send a heartbeat and usage, ms. */
    reportIntervalMs: z.number().int().min(50).max(60_000).default(1000),
    /**
     * Forget an agent silent for this long (ms): its lease and grace are long over, so it holds at most its safe
     * share, and a crashed or forged agent must not pin its region at that share for ever. The cost: an agent
     * partitioned from NATS (but not from its Redis) for longer than this may decide at its safe share while the
     * coordinator no longer counts it, an overshoot of at most that region's safe share less its issued share
     * for as long as the partition lasts. Ten minutes by default; see docs/security.md.
     */
    forgetAfterMs: z.number().int().positive().default(600_000),
    /** Most agents per region; heartbeats from further new agents are refused (a live agent's are not). */
    maxAgentsPerRegion: z.number().int().min(1).max(100_000).default(64),
    /**
     * Most per-subject overrides per policy; 0 (the default) turns them off. Borrowing gives a subject its budget
     * wherever its traffic is (core/borrowing/), and overrides, which move a subject's shares after its noisy
     * demand, cost more than they give beside it (docs/simulations.md, "Per-subject overrides").
     */
    maxOverridesPerPolicy: z.number().int().min(0).max(1024).default(0),
    /** An override whose subject has not been constrained for this long reverts to the policy's shares, ms. */
    overrideTtlMs: z.number().int().min(1000).max(3_600_000).default(30_000),
  })
  .refine((s) => s.graceMs > s.leaseMs, { message: 'graceMs must be longer than leaseMs', path: ['graceMs'] })
  // The coordinator learns which renewal an agent holds from the agent's next heartbeat, a report interval
  // later, and counts that renewal as held for leaseMs - reportIntervalMs - skewMs from its grant. To hear of the
  // next renewal before that runs out, leases must outlast three report intervals plus the skew margin; shorter
  // ones would make every agent look possibly lapsed and pin all regions at their safe shares.
  .refine((s) => 3 * s.reportIntervalMs + s.skewMs <= s.leaseMs, {
    message: 'leaseMs must be at least 3 × reportIntervalMs + skewMs',
    path: ['leaseMs'],
  });
export type LeaseSettings = z.output<typeof LeaseSettings>;
export type LeaseSettingsInput = z.input<typeof LeaseSettings>;

export const defaultLeaseSettings: LeaseSettings = LeaseSettings.parse({});

/**
 * How long an agent has to acknowledge a shrink before the coordinator stops renewing it. An agent that lapses
 * may take its safe share once the grace period ends. Before then the coordinator must notice (one skew margin),
 * shrink the live regions (one round of `roundMs`), and any agent that does not acknowledge in time must lapse
 * too (its lease, one more skew margin): what is left is the acknowledgement deadline. Throws when nothing is.
 */
export function ackTimeoutMs(lease: LeaseSettings, roundMs: number): number {
  const timeout = lease.graceMs - lease.leaseMs - 2 * lease.skewMs - roundMs;
  if (timeout <= 0) {
    throw new RangeError(
      'graceMs must exceed leaseMs + 2 × skewMs + roundMs, so agents that do not acknowledge a shrink lapse in time',
    );
  }
  return timeout;
}
