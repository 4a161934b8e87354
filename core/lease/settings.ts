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
     * Forget an agent silent for this long (ms). Off by default: a silent agent may be partitioned and still
     * deciding at its safe share, so forgetting it needs evidence (a goodbye, a new agent with the same instance
     * name, or an operator). Setting it trades that guarantee for headroom after crashes; see docs.
     */
    forgetAfterMs: z.number().int().positive().optional(),
    /** Most per-subject overrides per policy. */
    maxOverridesPerPolicy: z.number().int().min(0).max(1024).default(16),
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
