/**
 * One object of results.json: a strategy's run of a scenario. Counts are requests unless named `…Cost` (tokens).
 */
import { z } from 'zod';
import { ownRecord } from '../../core/own-keys.js';

const count = z.number().int().min(0);
const latency = z.strictObject({ p50: z.number(), p99: z.number(), max: z.number() });

export const StrategyResult = z.strictObject({
  scenario: z.string(),
  strategy: z.string(),
  seed: z.number().int(),
  regions: z.array(z.string()),
  /** Present in a sweep: the setting varied and its value in this run. */
  sweep: z.strictObject({ setting: z.string(), value: z.union([z.number(), z.string()]) }).optional(),
  /** Max over subjects and windows (1, 10, 60 s) of admitted(W) / (C + R·W). */
  overAdmission: z.number(),
  overAdmissionByWindow: ownRecord(z.string(), z.number()),
  /** Where the worst window was (subject id, window, start), null when nothing was admitted. */
  worstWindow: z
    .strictObject({ subject: z.number(), windowS: z.number(), startS: z.number(), admitted: z.number() })
    .nullable(),
  /**
   * Admitted cost / cost the ideal oracle admitted on the same arrivals, counting requests that arrived after
   * the warm-up (`warmupS`); null when ideal admitted nothing.
   */
  utilisation: z.number().nullable(),
  /** The same over the whole run, warm-up included. */
  utilisationWholeRun: z.number().nullable(),
  /**
   * The subject admitted the smallest fraction of what the ideal oracle (one global bucket per subject fed the
   * same arrivals) admitted it after the warm-up, among subjects the oracle admitted at least 10 × maxCost;
   * null when none qualifies. `admittedFraction` 0.9 means that tenant got 90% of its budget's worth.
   */
  worstSubject: z
    .strictObject({ subject: z.number(), admittedFraction: z.number(), idealAdmittedCost: z.number() })
    .nullable(),
  /** Requests denied that ideal admitted, over all requests. */
  falseDenialRate: z.number(),
  /**
   * Requests admitted that ideal denied, over all requests. Under saturation a strategy that admits as much as
   * ideal but different requests shows both rates; their difference is the net loss.
   */
  falseAdmissionRate: z.number(),
  /** Seconds after the (worst) demand shift until admissions track ideal; null when they never do. */
  convergenceSeconds: z.number().nullable(),
  /**
   * Seconds after the (worst) shift until the policy's shares in force stop moving (each region within 0.02 of
   * where it ends the phase): the control loop's reaction time; null without shares or when still moving.
   */
  sharesSettledSeconds: z.number().nullable(),
  /** Control-plane messages (reports, leases, acks) per simulated second. */
  controlMessagesPerSecond: z.number(),
  /** Forwarded decisions and their replies (strict) per simulated second. */
  forwardedMessagesPerSecond: z.number(),
  /** Decision latency from arrival at the agent to the answer, ms (local store time not modelled: 0). */
  latencyMs: latency,
  /** The same over forwarded decisions only; null when none was forwarded. */
  forwardedLatencyMs: latency.nullable(),
  requests: count,
  /** First attempts (requests minus client retries). */
  arrivals: count,
  retries: count,
  /** Decisions forwarded to another region (strict). */
  forwarded: count,
  admitted: count,
  admittedCost: z.number(),
  denied: count,
  idealAdmitted: count,
  idealAdmittedCost: z.number(),
  falseDenials: count,
  falseAdmissions: count,
  /** Degraded decisions by reason (home_unreachable, emergency_bucket). */
  degraded: ownRecord(z.string(), count),
  /** Strategy-specific counters (lostGrants: grants whose reply never reached the client in time). */
  counters: ownRecord(z.string(), count),
  network: z.strictObject({ control: count, data: count, lost: count, dropped: count }),
  /** Most live bucket keys seen in each region's store. */
  peakKeys: ownRecord(z.string(), count),
  /**
   * Largest sum over regions of the shares in force at the agents (1 = budget conserved), over every change the
   * strategy reported and every allocation unit (the policy's vector and per-subject overrides); null without a
   * regional split.
   */
  maxShareSum: z.number().nullable(),
  /** Simulated seconds during which some unit's shares in force summed above 1; null without a regional split. */
  shareSumAboveOneS: z.number().nullable(),
  durationS: z.number(),
  settings: ownRecord(z.string(), z.union([z.number(), z.string()])),
});
export type StrategyResult = z.infer<typeof StrategyResult>;

export const Results = z.array(StrategyResult);
