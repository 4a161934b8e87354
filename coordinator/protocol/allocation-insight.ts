/**
 * What the coordinator tells operators about its allocations beyond the shares: admitted and refused rates per
 * region (smoothed from the same usage reports that drive demand), the moves of each policy's shares with their
 * reason, and a short history per policy for the dashboard. It reads the lease coordinator's views only, and
 * rounds every number it answers with (core/admin-numbers.ts).
 */
import {
  floorAmount,
  roundAmount,
  roundDerivedRate,
  roundShare,
  roundShares,
} from '../../core/admin-numbers.js';
import type {
  AllocationSample,
  AllocationSummary,
  MoveReason,
  RegionAllocation,
  ShareMove,
} from '../../core/wire/admin.js';
import type { AllocationView, RegionView } from '../../core/lease/allocation-views.js';
import { kindOf } from '../../core/kinds/index.js';
import { ownValue, setOwn } from '../../core/own-keys.js';
import { DemandTracker } from '../../core/rebalance/demand.js';
import { shareOfBudget } from '../../core/shares/share-sizing.js';
import type { Usage } from '../../core/wire/protocol.js';

/** Moves kept per policy (newest first in answers). */
export const MOVES_KEPT = 10;
/** History samples kept per policy: one per round, so two minutes at the default 1 s round. */
export const SAMPLES_KEPT = 120;
/** Shares closer than this are the same share (the rounding of answers). */
const SAME = 5e-5;

interface PolicyInsight {
  admitted: DemandTracker<string>;
  refused: DemandTracker<string>;
  /** Shares of the last allocation record written, null before the first. */
  written: Record<string, number> | null;
  moves: ShareMove[];
  samples: AllocationSample[];
}

export class AllocationInsight {
  readonly #regions: readonly string[];
  readonly #index: Map<string, number>;
  readonly #halfLifeMs: number;
  readonly #policies = new Map<string, PolicyInsight>();

  constructor(regions: readonly string[], halfLifeMs: number) {
    this.#regions = regions;
    this.#index = new Map(regions.map((r, i) => [r, i]));
    this.#halfLifeMs = halfLifeMs;
  }

  #of(policy: string): PolicyInsight {
    let p = this.#policies.get(policy);
    if (p === undefined) {
      p = {
        admitted: new DemandTracker(this.#halfLifeMs),
        refused: new DemandTracker(this.#halfLifeMs),
        written: null,
        moves: [],
        samples: [],
      };
      this.#policies.set(policy, p);
    }
    return p;
  }

  /** Shares already in the allocation bucket when the coordinator started: a baseline, not a move. */
  restored(policy: string, shares: Record<string, number>): void {
    this.#of(policy).written = { ...shares };
  }

  /** One usage report (chunk) of one agent, already accepted by the lease coordinator. */
  usage(message: Usage, now: number): void {
    const tag = this.#index.get(message.region);
    if (tag === undefined) return;
    for (const u of message.policies) {
      const p = this.#policies.get(u.policy);
      if (p === undefined) continue;
      p.admitted.observe(message.agentId, u.admitted, message.intervalMs, now, tag);
      p.refused.observe(message.agentId, u.denied, message.intervalMs, now, tag);
    }
  }

  /** The policy is gone: forget what was kept of it. */
  removed(policy: string): void {
    this.#policies.delete(policy);
  }

  /**
   * An allocation record of `view.policy` was written at `revision`: the move it carried, if its shares changed,
   * with the reason read from the state around it.
   */
  written(
    view: AllocationView,
    revision: number,
    regions: readonly RegionView[],
    now: number,
  ): ShareMove | undefined {
    const p = this.#of(view.policy);
    const before = p.written;
    p.written = { ...view.shares };
    if (
      before !== null &&
      !this.#regions.some(
        (r) => Math.abs((ownValue(before, r) ?? 0) - (ownValue(view.shares, r) ?? 0)) > SAME,
      )
    ) {
      return undefined;
    }
    // The engine says why it moved the shares, with the demand it saw; a record of an earlier incarnation
    // (nothing moved here yet) is read from the state around it.
    const cause = view.cause;
    const reason: MoveReason =
      before === null
        ? 'created'
        : cause !== undefined
          ? cause.reason
          : regions.some((r) => r.agents.some((a) => a.lapsed))
            ? 'lapsed_region'
            : 'demand';
    const move: ShareMove = {
      at: new Date(now).toISOString(),
      policy: view.policy,
      epoch: view.epoch,
      revision,
      from: before === null ? null : roundShares(before),
      to: roundShares(view.shares),
      reason,
      demand: rounded(before === null || cause === undefined ? view.demand : cause.demand),
      ...(before === null || cause === undefined
        ? {}
        : {
            unmet: rounded(cause.unmet),
            target: cause.target === null ? null : roundShares(cause.target),
          }),
    };
    p.moves.unshift(move);
    p.moves.length = Math.min(p.moves.length, MOVES_KEPT);
    return move;
  }

  /** One sample per policy, after a round. */
  sample(views: readonly AllocationView[], now: number): void {
    const at = new Date(now).toISOString();
    for (const view of views) {
      const p = this.#of(view.policy);
      p.samples.push({
        at,
        shares: roundShares(view.shares),
        demand: rounded(view.demand),
        admitted: this.#rates(p.admitted, now),
        refused: this.#rates(p.refused, now),
      });
      if (p.samples.length > SAMPLES_KEPT) p.samples.splice(0, p.samples.length - SAMPLES_KEPT);
      if (p.samples.length % 10 === 0) {
        p.admitted.prune(now, 60_000);
        p.refused.prune(now, 60_000);
      }
    }
  }

  history(policy: string): AllocationSample[] | undefined {
    return this.#policies.get(policy)?.samples;
  }

  /** The admin API's view of one allocation: per region what it holds and gives, and the latest moves. */
  summary(view: AllocationView, regions: readonly RegionView[], now: number): AllocationSummary {
    const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
    const p = this.#policies.get(view.policy);
    const admitted = p === undefined ? {} : this.#rates(p.admitted, now);
    const refused = p === undefined ? {} : this.#rates(p.refused, now);
    const perRegion: Record<string, RegionAllocation> = {};
    for (const region of this.#regions) {
      const share = ownValue(view.shares, region) ?? 0;
      const lease = ownValue(view.leases, region);
      const live = regions.find((r) => r.region === region)?.agents.filter((a) => !a.lapsed) ?? [];
      const renewed = live.reduce<number | null>(
        (latest, a) => (a.lastHeartbeatAt === null ? latest : Math.max(latest ?? 0, a.lastHeartbeatAt)),
        null,
      );
      const pending = ownValue(view.pending, region) ?? null;
      const gives = shareOfBudget(view.budget, share);
      setOwn(perRegion, region, {
        share: roundShare(share),
        pending: pending === null ? null : roundShare(pending),
        capacity: floorAmount(gives.capacity),
        refillPerSecond: floorAmount(gives.refillPerSecond),
        demandPerSecond: roundAmount(ownValue(view.demand, region) ?? 0),
        admittedPerSecond: ownValue(admitted, region) ?? 0,
        refusedPerSecond: ownValue(refused, region) ?? 0,
        lease: {
          expiresAt: iso(lease?.expiresAt ?? null),
          acked: lease?.acked ?? true,
          holders: live.map((a) => a.instance).sort(),
          renewedAt: iso(renewed),
        },
      });
    }
    return {
      policy: view.policy,
      version: view.version,
      epoch: view.epoch,
      shares: roundShares(view.shares),
      leases: Object.fromEntries(
        Object.entries(view.leases).map(([region, l]) => [
          region,
          { expiresAt: iso(l.expiresAt), acked: l.acked },
        ]),
      ),
      overrides: view.overrides.map((o) => ({
        subject: o.subject,
        shares: roundShares(o.shares),
        epoch: o.epoch,
        expiresAt: iso(o.expiresAt),
      })),
      budget: {
        capacity: view.budget.capacity,
        refillPerSecond:
          kindOf(view.kind).rate === 'declared'
            ? view.budget.refillPerSecond
            : roundDerivedRate(view.budget.refillPerSecond),
      },
      regions: perRegion,
      moves: [...(p?.moves ?? [])],
    };
  }

  #rates(tracker: DemandTracker<string>, now: number): Record<string, number> {
    const sums = tracker.sumByTag(
      now,
      this.#regions.map(() => 0),
    );
    return Object.fromEntries(this.#regions.map((r, i) => [r, roundAmount(sums[i] ?? 0)]));
  }
}

function rounded(values: Readonly<Record<string, number>>): Record<string, number> {
  return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, roundAmount(v)]));
}
