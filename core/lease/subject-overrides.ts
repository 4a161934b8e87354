/**
 * Per-subject overrides: which subjects' demand the coordinator tracks, which it asks agents to report every
 * interval (the watch list), when a subject gets a share vector of its own, and when that override reverts to the
 * policy's. The override units then move under the same conservation rules as the policy's default vector
 * (lease-coordinator.ts).
 */
import { DemandTracker } from '../rebalance/demand.js';
import type { RebalanceSettings } from '../rebalance/settings.js';
import { idealShares, idealSharesWithin, stepToward } from '../rebalance/target.js';
import { MAX_WATCHED_PER_POLICY } from '../wire/protocol.js';
import {
  copyUnit,
  EPSILON,
  inFlight,
  maxGap,
  SUBJECT_SMOOTHING,
  type PolicyState,
  type SubjectDemand,
  type Unit,
} from './allocation-state.js';
import type { EngineCounters } from './engine-counters.js';
import type { LeaseSettings } from './settings.js';

/** Subjects tracked per policy for overrides, per override slot. */
const SUBJECTS_PER_OVERRIDE_SLOT = 4;

/** What the override rules need from the lease coordinator. */
export interface OverrideContext {
  readonly settings: RebalanceSettings;
  readonly lease: LeaseSettings;
  readonly regionCount: number;
  readonly counters: EngineCounters;
  /** The policy's record changed. */
  touch(state: PolicyState): void;
  /** A new unit carries pending shrinks: acknowledgements must look at it. */
  trackPending(unit: Unit, state: PolicyState): void;
}

export class SubjectOverrides {
  readonly #ctx: OverrideContext;

  constructor(context: OverrideContext) {
    this.#ctx = context;
  }

  /** One subject's usage in one region over one interval. */
  observe(
    state: PolicyState,
    key: string,
    region: number,
    subject: string,
    requested: number,
    denied: number,
    intervalMs: number,
    now: number,
  ): void {
    let entry = state.subjects.get(subject);
    if (entry === undefined) {
      const cap = Math.max(1, this.#ctx.lease.maxOverridesPerPolicy * SUBJECTS_PER_OVERRIDE_SLOT);
      if (state.subjects.size >= cap) {
        // Evict the subject least recently denied that has no override.
        let oldest: string | undefined;
        let oldestAt = Infinity;
        for (const [s, d] of state.subjects) {
          if (!state.overrides.has(s) && d.lastDeniedAt < oldestAt) {
            oldest = s;
            oldestAt = d.lastDeniedAt;
          }
        }
        if (oldest === undefined) return;
        state.subjects.delete(oldest);
      }
      // One subject's demand is sparse and noisy: smooth it over three times as long as a policy's.
      entry = {
        tracker: new DemandTracker(SUBJECT_SMOOTHING * this.#ctx.settings.demandHalfLifeMs),
        lastDeniedAt: 0,
        deniedRate: 0,
      };
      state.subjects.set(subject, entry);
    }
    entry.tracker.observe(key, requested, intervalMs, now, region);
    if (denied > 0) {
      entry.lastDeniedAt = now;
      entry.deniedRate = (denied * 1000) / intervalMs;
    }
  }

  /**
   * Where a subject's shares should go. Its demand is known in the regions that reported it recently — as one of
   * their most constrained subjects, or because the record watches it and every agent reports it then, zero
   * included. A region without a recent report of it keeps the policy's share rather than look like it has no
   * demand (a report of constrained subjects is bounded: absence from it means nothing).
   */
  ideal(state: PolicyState, entry: SubjectDemand, now: number): number[] | undefined {
    return idealSharesWithin(
      entry.tracker.sumByTag(now, this.#zeros()),
      this.#knownIn(entry, now),
      state.base.shares,
      state.floor,
    );
  }

  /** Create overrides for constrained subjects, start reverting quiet ones, drop those back at the default. */
  manage(state: PolicyState, now: number): void {
    const { lease, settings, counters } = this.#ctx;
    for (const [subject, unit] of state.overrides) {
      const entry = state.subjects.get(subject);
      // Revert when the subject stopped being constrained, or its demand is shaped like the policy's again.
      const ideal = entry === undefined ? undefined : this.ideal(state, entry, now);
      const quiet =
        entry === undefined ||
        now - entry.lastDeniedAt > lease.overrideTtlMs ||
        (ideal !== undefined && this.#shapeGap(state, ideal, now) < settings.hysteresis);
      if (quiet) state.reverting.add(subject);
      else state.reverting.delete(subject);
      if (
        state.reverting.has(subject) &&
        !inFlight(unit) &&
        !inFlight(state.base) &&
        unit.shares.every((s, r) => Math.abs(s - state.base.shares[r]!) <= EPSILON)
      ) {
        state.overrides.delete(subject);
        state.reverting.delete(subject);
        counters.overridesRemoved++;
        this.#ctx.touch(state);
      }
    }
    const candidates = [...state.subjects]
      .filter(([s, d]) => !state.overrides.has(s) && now - d.lastDeniedAt <= lease.overrideTtlMs)
      .sort((a, b) => b[1].deniedRate - a[1].deniedRate || (a[0] < b[0] ? -1 : 1));
    this.#updateWatch(state, candidates, now);
    const room = lease.maxOverridesPerPolicy - state.overrides.size;
    if (room <= 0) return;
    // A candidate gets an override only once every region has reported its demand (the watch list asks them to),
    // so the override follows where the subject's demand really is.
    const settled = 2 * settings.demandHalfLifeMs + 2 * lease.reportIntervalMs;
    let created = 0;
    for (const [subject, entry] of candidates) {
      if (created >= room) break;
      const since = state.watchedSince.get(subject);
      if (since === undefined || now - since < settled) continue;
      if (!this.#knownIn(entry, now).every(Boolean)) continue;
      // Only worth an override when the subject's demand is shaped clearly unlike the policy's shares: twice
      // the hysteresis, so the noise of one subject's few requests does not create and swing overrides.
      const ideal = this.ideal(state, entry, now);
      if (ideal === undefined || this.#shapeGap(state, ideal, now) < 2 * settings.hysteresis) continue;
      const next = stepToward(state.base.shares, ideal, state.floor, settings);
      if (next === undefined) continue;
      const copy = copyUnit(state.base);
      state.overrides.set(subject, copy);
      if (inFlight(copy)) this.#ctx.trackPending(copy, state);
      created++;
      counters.overridesCreated++;
      this.#ctx.touch(state);
    }
  }

  /** Forget subjects quiet for two override lifetimes that hold no override. */
  prune(state: PolicyState, now: number): void {
    for (const [subject, d] of state.subjects) {
      if (
        !state.overrides.has(subject) &&
        now - Math.max(d.lastDeniedAt, d.tracker.lastSeenAny()) > 2 * this.#ctx.lease.overrideTtlMs
      ) {
        state.subjects.delete(subject);
      }
    }
  }

  /** When the override of `subject` starts reverting unless the subject is constrained again. */
  expiresAt(state: PolicyState, subject: string): number | null {
    const seen = state.subjects.get(subject)?.lastDeniedAt;
    return seen === undefined ? null : seen + this.#ctx.lease.overrideTtlMs;
  }

  /** How far a subject's ideal shares are from the policy's, both from demand smoothed alike. */
  #shapeGap(state: PolicyState, subjectIdeal: readonly number[], now: number): number {
    const policy = idealShares(state.slowDemand.sumByTag(now, this.#zeros()), state.floor);
    return maxGap(subjectIdeal, policy ?? state.base.shares);
  }

  #knownIn(entry: SubjectDemand, now: number): boolean[] {
    const seen = entry.tracker.lastSeenByTag(new Array<number>(this.#ctx.regionCount).fill(-Infinity));
    const recent =
      2 * SUBJECT_SMOOTHING * this.#ctx.settings.demandHalfLifeMs + 2 * this.#ctx.lease.reportIntervalMs;
    return seen.map((at) => now - at <= recent);
  }

  /**
   * Watch the overrides and the most denied candidates (up to MAX_WATCHED_PER_POLICY): every agent reports their
   * demand each interval. The list changes only when its membership does.
   */
  #updateWatch(state: PolicyState, candidates: [string, SubjectDemand][], now: number): void {
    if (this.#ctx.lease.maxOverridesPerPolicy === 0) return;
    const want = [...state.overrides.keys()];
    for (const [subject] of candidates) {
      if (want.length >= MAX_WATCHED_PER_POLICY) break;
      want.push(subject);
    }
    want.sort();
    if (want.length === state.watch.length && want.every((s, i) => s === state.watch[i])) return;
    const next = new Map<string, number>();
    for (const s of want) next.set(s, state.watchedSince.get(s) ?? now);
    state.watch = want;
    state.watchedSince = next;
    this.#ctx.touch(state);
  }

  #zeros(): number[] {
    return new Array<number>(this.#ctx.regionCount).fill(0);
  }
}
