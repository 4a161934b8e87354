/**
 * Read-only views of the lease coordinator for the admin API: allocations by policy and agents by region. Plain
 * data, built on each call from the coordinator's state; nothing here changes it, and a view shares nothing
 * with it.
 */
import { setOwn } from '../own-keys.js';
import type { PolicyKind } from '../policy/policy.js';
import type { AgentRoster } from './agent-roster.js';
import { byRegion } from './allocation-records.js';
import type { MoveCause, PolicyState } from './allocation-state.js';

/** Allocation of one policy, as the admin API shows it. */
export interface AllocationView {
  policy: string;
  version: number;
  epoch: number;
  shares: Record<string, number>;
  leases: Record<string, { expiresAt: number | null; acked: boolean }>;
  /** `expiresAt`: when the override starts reverting unless its subject is constrained again. */
  overrides: { subject: string; epoch: number; shares: Record<string, number>; expiresAt: number | null }[];
  /** The policy's global budget, which the shares split. */
  budget: { capacity: number; refillPerSecond: number };
  /** The policy's kind: a sliding log's refill is derived (capacity / windowSeconds). */
  kind: PolicyKind;
  /** Share a region held before a shrink its agents have not all acknowledged yet; null when none is pending. */
  pending: Record<string, number | null>;
  /** Smoothed demand the rebalancer steers by, tokens per second, by region. */
  demand: Record<string, number>;
  /** Why the default shares last moved, by region where a vector; undefined before the first move. */
  cause?:
    | {
        reason: MoveCause['reason'];
        demand: Record<string, number>;
        unmet: Record<string, number>;
        target: Record<string, number> | null;
      }
    | undefined;
}

/** One agent, as the admin API shows it. */
export interface AgentView {
  agentId: string;
  instance: string;
  lastHeartbeatAt: number | null;
  leaseUntil: number | null;
  appliedRevision: number;
  ackRevision: number;
  lapsed: boolean;
  /** Decision requests shed per second, over the interval of its last heartbeat. */
  shedPerSecond: number;
}

/** One region, as the admin API shows it. */
export interface RegionView {
  region: string;
  agents: AgentView[];
  lastReportAt: number | null;
  lagMs: number | null;
}

/** The view of one policy's allocation; `overrideExpiry` says when a subject's override starts reverting. */
export function allocationView(
  regions: readonly string[],
  state: PolicyState,
  roster: AgentRoster,
  overrideExpiry: (subject: string) => number | null,
  now: number,
): AllocationView {
  const leases: AllocationView['leases'] = {};
  const cause = state.base.cause;
  regions.forEach((region, r) => {
    setOwn(leases, region, { expiresAt: roster.leaseExpiry(r), acked: state.base.pending[r] === undefined });
  });
  return {
    policy: state.policy.name,
    version: state.policy.version,
    epoch: state.epoch,
    shares: byRegion(regions, state.base.shares),
    leases,
    overrides: [...state.overrides].map(([subject, unit]) => ({
      subject,
      epoch: unit.epoch,
      shares: byRegion(regions, unit.shares),
      expiresAt: overrideExpiry(subject),
    })),
    budget: { capacity: state.policy.capacity, refillPerSecond: state.policy.refillPerSecond },
    kind: state.policy.kind,
    pending: Object.fromEntries(regions.map((region, r) => [region, state.base.pending[r] ?? null])),
    demand: byRegion(regions, state.demand.sumByTag(now, new Array<number>(regions.length).fill(0))),
    cause:
      cause === undefined
        ? undefined
        : {
            reason: cause.reason,
            demand: byRegion(regions, cause.demand),
            unmet: byRegion(regions, cause.unmet),
            target: cause.target === undefined ? null : byRegion(regions, cause.target),
          },
  };
}

/** The view of region `region` (index `r`), last heard from at `lastReportAt`. */
export function regionView(
  region: string,
  r: number,
  roster: AgentRoster,
  lastReportAt: number | undefined,
  now: number,
): RegionView {
  const agents = [...roster.inRegion(r)].map((a) => ({
    agentId: a.id,
    instance: a.instance,
    lastHeartbeatAt: a.lastHeartbeatAt ?? null,
    leaseUntil: a.leaseUntil > 0 ? a.leaseUntil : null,
    appliedRevision: a.appliedRevision,
    ackRevision: a.ackRevision,
    lapsed: roster.possiblyLapsed(a, now),
    shedPerSecond: a.shedPerSecond,
  }));
  return {
    region,
    agents,
    lastReportAt: lastReportAt ?? null,
    lagMs: lastReportAt === undefined ? null : now - lastReportAt,
  };
}
