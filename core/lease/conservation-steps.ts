/**
 * The conservation rules on allocation units: shrink first (a shrunk region counts at its old share until every
 * live agent there acknowledges the record revision that carries the shrink), grow only into the room the claims
 * leave, and shrink live regions when lapsed agents may be holding their safe shares. It also tracks, per region,
 * the shrinks not yet written and the revision agents must have applied before their lease counts.
 */
import type { AgentRoster } from './agent-roster.js';
import { claimOf, EPSILON, inFlight, unitsOf, type PolicyState, type Unit } from './allocation-state.js';
import type { EngineCounters } from './engine-counters.js';

/** What the conservation rules need from the lease coordinator. */
export interface ConservationContext {
  readonly safe: readonly number[];
  readonly counters: EngineCounters;
  readonly roster: AgentRoster;
  learning(now: number): boolean;
  /** The policy's record changed. */
  touch(state: PolicyState): void;
}

export class ConservationSteps {
  readonly #ctx: ConservationContext;
  readonly #regionCount: number;
  /** Units with pending shrinks, and their policy: acknowledgements only look at these. */
  readonly #pendingUnits = new Map<Unit, PolicyState>();
  /** Per region: KV revision of the latest write that shrank it; an agent's lease counts once it applied this. */
  readonly #shrinkHighWater: number[];
  /**
   * Per region: when each shrink issued but not yet written was issued (agents returning from a lapse wait for
   * them; the oldest starts the acknowledgement deadline, see `unwrittenSince`).
   */
  readonly #unwrittenShrinkTimes: number[][];

  constructor(context: ConservationContext) {
    this.#ctx = context;
    this.#regionCount = context.safe.length;
    this.#shrinkHighWater = context.safe.map(() => 0);
    this.#unwrittenShrinkTimes = context.safe.map(() => []);
  }

  /** The revision agents of `region` must have applied before a renewal lets them above their safe share. */
  minRevision(region: number): number {
    return this.#shrinkHighWater[region]!;
  }

  /** Some shrink of `region` is issued but not yet written. */
  unwrittenIn(region: number): boolean {
    return this.#unwrittenShrinkTimes[region]!.length > 0;
  }

  /**
   * When the oldest shrink of `region` not yet written was issued, or undefined when none is. The deadline for
   * the region's agents to acknowledge a shrink runs from its issue, not from its write: a write that keeps
   * failing must not push it back past the grace period of a lapsed agent the shrink makes room for.
   */
  unwrittenSince(region: number): number | undefined {
    // A loop, not Math.min(...times): a long KV outage over many policies can hold more issue times than a call
    // takes arguments.
    let oldest: number | undefined;
    for (const at of this.#unwrittenShrinkTimes[region]!)
      if (oldest === undefined || at < oldest) oldest = at;
    return oldest;
  }

  /** A unit carries pending shrinks: acknowledgements must look at it. */
  track(unit: Unit, state: PolicyState): void {
    this.#pendingUnits.set(unit, state);
  }

  /** A record persisted at `revision` was restored: its pending shrinks are tracked, every region waits for it. */
  restored(state: PolicyState, revision: number): void {
    for (const u of unitsOf(state)) if (inFlight(u)) this.#pendingUnits.set(u, state);
    for (let r = 0; r < this.#regionCount; r++) {
      this.#shrinkHighWater[r] = Math.max(this.#shrinkHighWater[r]!, revision);
    }
  }

  /** The policy is gone: forget what it had in flight. */
  removed(state: PolicyState): void {
    for (const unit of unitsOf(state)) this.#pendingUnits.delete(unit);
    for (const shrink of state.unwrittenShrinks) {
      for (const r of shrink.regions) this.#forgetUnwritten(r, shrink.at);
    }
  }

  /**
   * A removed policy is back (`removed` forgot it): its pending shrinks are tracked again, and those not yet
   * written count toward their regions' deadlines again.
   */
  revived(state: PolicyState): void {
    for (const unit of unitsOf(state)) if (inFlight(unit)) this.#pendingUnits.set(unit, state);
    for (const shrink of state.unwrittenShrinks) {
      for (const r of shrink.regions) this.#unwrittenShrinkTimes[r]!.push(shrink.at);
    }
  }

  /** The record of `state` as of change `seq` is persisted at `revision`. */
  written(state: PolicyState, seq: number, revision: number, now: number): void {
    for (const unit of unitsOf(state)) {
      if (!this.#pendingUnits.has(unit)) continue;
      if (unit.pendingRevision === undefined && inFlight(unit) && unit.pendingSeq <= seq) {
        unit.pendingRevision = revision;
        unit.pendingSince = now;
      }
    }
    const remaining: PolicyState['unwrittenShrinks'] = [];
    for (const shrink of state.unwrittenShrinks) {
      if (shrink.seq > seq) {
        remaining.push(shrink);
        continue;
      }
      for (const r of shrink.regions) {
        this.#forgetUnwritten(r, shrink.at);
        this.#shrinkHighWater[r] = Math.max(this.#shrinkHighWater[r]!, revision);
        // The deadline runs from the issue: the claims counted on this shrink from then on.
        this.#ctx.roster.requireAck(r, revision, shrink.at);
      }
    }
    state.unwrittenShrinks = remaining;
    for (const unit of unitsOf(state)) {
      if (!this.#pendingUnits.has(unit)) continue;
      for (let r = 0; r < this.#regionCount; r++) this.#settleUnit(state, unit, r, now);
    }
  }

  /** Clear the pending shrinks of `region` that every agent there acknowledged (or can no longer hold). */
  settle(region: number, now: number): void {
    if (this.#pendingUnits.size === 0) return;
    for (const [unit, state] of [...this.#pendingUnits]) this.#settleUnit(state, unit, region, now);
  }

  /** Move a unit toward `next`: shrinks now (pending until acknowledged), grows when they are. */
  step(state: PolicyState, unit: Unit, next: number[], now: number, lapsed: readonly boolean[]): void {
    const shrunk: number[] = [];
    for (let r = 0; r < next.length; r++) {
      if (next[r]! < unit.shares[r]! - EPSILON) {
        unit.pending[r] = Math.max(unit.pending[r] ?? 0, unit.shares[r]!);
        unit.shares[r] = next[r]!;
        shrunk.push(r);
      }
    }
    unit.target = next;
    if (shrunk.length > 0) {
      this.#recordShrink(state, unit, shrunk, now);
      this.#ctx.counters.shrinks++;
      return;
    }
    this.#grow(state, unit, now, lapsed);
  }

  /**
   * A region whose every agent lapsed holds at most its safe share; shrink its issued share to that, so the rest
   * can go elsewhere and returning agents catch up (the shrink raises the region's minimum revision) first.
   */
  releaseUnreachable(state: PolicyState, unit: Unit, unreachable: readonly boolean[], now: number): void {
    const safe = this.#ctx.safe;
    const shrunk: number[] = [];
    for (let r = 0; r < this.#regionCount; r++) {
      if (!unreachable[r] || unit.shares[r]! <= safe[r]! + EPSILON) continue;
      unit.shares[r] = safe[r]!;
      // Nobody there can acknowledge; the lapsed agents are covered by the safe share in the claim.
      unit.pending[r] = undefined;
      shrunk.push(r);
    }
    if (shrunk.length === 0) return;
    if (!inFlight(unit)) {
      unit.pendingRevision = undefined;
      this.#pendingUnits.delete(unit);
    }
    unit.epoch++;
    this.#ctx.touch(state);
    this.#noteUnwrittenShrink(state, shrunk, now);
  }

  /**
   * When an agent lapsed, it may move to its safe share after the grace period: if the claims no longer fit,
   * shrink the regions above their safe share, in proportion, just enough (live agents acknowledge; lapsed ones
   * are covered by their safe share).
   */
  restoreBudget(state: PolicyState, unit: Unit, lapsed: readonly boolean[], now: number): void {
    const safe = this.#ctx.safe;
    // Pending shrinks are already on their way down: count what the claims settle at, so a cut is made once.
    let total = 0;
    for (let r = 0; r < this.#regionCount; r++) total += Math.max(unit.shares[r]!, lapsed[r] ? safe[r]! : 0);
    const excess = total - 1;
    if (excess <= EPSILON) return;
    let above = 0;
    for (let r = 0; r < this.#regionCount; r++) above += Math.max(0, unit.shares[r]! - safe[r]!);
    if (above <= EPSILON) return;
    const shrunk: number[] = [];
    for (let r = 0; r < this.#regionCount; r++) {
      const spare = Math.max(0, unit.shares[r]! - safe[r]!);
      if (spare <= 0) continue;
      const cut = Math.min(spare, (excess * spare) / above + EPSILON);
      unit.pending[r] = Math.max(unit.pending[r] ?? 0, unit.shares[r]!);
      unit.shares[r] = unit.shares[r]! - cut;
      shrunk.push(r);
    }
    unit.target = undefined;
    this.#recordShrink(state, unit, shrunk, now);
    this.#ctx.counters.safetyShrinks++;
  }

  #settleUnit(state: PolicyState, unit: Unit, region: number, now: number): void {
    if (unit.pending[region] === undefined || unit.pendingRevision === undefined) return;
    if (!this.#ctx.roster.regionAcknowledged(region, unit.pendingRevision, now)) return;
    unit.pending[region] = undefined;
    if (!inFlight(unit)) {
      unit.pendingRevision = undefined;
      this.#pendingUnits.delete(unit);
      this.#grow(state, unit, now);
    }
  }

  /** Issue the grow half of a rebalance into the room the claims leave. */
  #grow(state: PolicyState, unit: Unit, now: number, knownLapsed?: readonly boolean[]): void {
    const target = unit.target;
    if (target === undefined || this.#ctx.learning(now)) return;
    const safe = this.#ctx.safe;
    const lapsed =
      knownLapsed ?? Array.from({ length: this.#regionCount }, (_, r) => this.#ctx.roster.lapsedIn(r, now));
    let changed = false;
    let reached = true;
    for (let r = 0; r < target.length; r++) {
      const want = target[r]! - unit.shares[r]!;
      if (want <= EPSILON) continue;
      let claimed = 0;
      for (let i = 0; i < target.length; i++) claimed += claimOf(unit, i, lapsed[i]!, safe[i]!);
      const room = 1 - claimed;
      const add = Math.min(want, room);
      if (add > EPSILON) {
        unit.shares[r] = unit.shares[r]! + add;
        changed = true;
      }
      if (add < want - EPSILON) reached = false;
    }
    if (reached) unit.target = undefined;
    if (changed) {
      unit.epoch++;
      this.#ctx.counters.grows++;
      this.#ctx.touch(state);
    }
  }

  #recordShrink(state: PolicyState, unit: Unit, regions: number[], now: number): void {
    unit.epoch++;
    this.#ctx.touch(state);
    unit.pendingRevision = undefined;
    unit.pendingSeq = state.seq;
    this.#pendingUnits.set(unit, state);
    this.#noteUnwrittenShrink(state, regions, now);
  }

  #noteUnwrittenShrink(state: PolicyState, regions: number[], now: number): void {
    state.unwrittenShrinks.push({ seq: state.seq, regions, at: now });
    for (const r of regions) this.#unwrittenShrinkTimes[r]!.push(now);
  }

  /** A shrink of `region` issued at `at` is written (or its policy gone). */
  #forgetUnwritten(region: number, at: number): void {
    const times = this.#unwrittenShrinkTimes[region]!;
    const i = times.indexOf(at);
    if (i >= 0) times.splice(i, 1);
  }
}
