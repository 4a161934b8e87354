/**
 * The coordinator's side of the conservation protocol, pure: it owns the shares of every regional policy (and of
 * per-subject overrides), renews agents' leases, and moves shares toward demand without ever letting the shares
 * in force add up to more than the budget. The NATS/KV shell (coordinator/protocol/) feeds it messages and time,
 * and persists what it asks to; the simulator feeds it a simulated network. The agents it knows live in an
 * AgentRoster (agent-roster.ts), the override rules in SubjectOverrides (subject-overrides.ts), the persisted
 * form in allocation-records.ts.
 *
 * Conservation, per allocation unit (a policy's default vector, or one subject's override):
 *   claim(r) = max(issued share of r, share r held before an unacknowledged shrink, safe share of r if some agent
 *              of r has let its lease lapse)
 * and Σ claim ≤ 1 always holds: shrinks are issued first and count at their old value until every agent of the
 * region acknowledges the record revision that carries them (or its lease lapses: then it holds at most its
 * safe share); grows are issued only into the room the claims leave. When an agent lapses, an agent in that
 * region may move to its safe share after the grace period; the coordinator then shrinks live regions until
 * the claims fit again, and stops renewing agents that do not acknowledge in time, so they lapse too before
 * the grace period ends. A restarted coordinator grows nothing while it learns (learning mode): until every agent
 * of the registry holds one of its renewals (no renewal is sent before the agent's registration is written, so the
 * registry names every agent that may hold a lease) and three report intervals after the first heartbeat, at most
 * one lease.
 */
import type { Clock } from '../clock.js';
import { ownValue } from '../own-keys.js';
import type { Policy } from '../policy/policy.js';
import { subjectDemand } from '../shares/usage-accounting.js';
import {
  defaultRebalanceSettings,
  RebalanceSettings,
  type RebalanceSettingsInput,
} from '../rebalance/settings.js';
import {
  liftToFloor,
  negligibleDemand,
  rebalanceRound,
  shareFloor,
  targetShares,
  wholeShares,
  type Cooldown,
  type RoundDemand,
} from '../rebalance/target.js';
import type {
  Ack,
  AgentRegistration,
  AllocationRecord,
  Bye,
  Heartbeat,
  RenewalReply,
  Usage,
} from '../wire/protocol.js';
import { AgentRoster, type RegistryWrite } from './agent-roster.js';
import {
  lowestChanged,
  lowestWindowMs,
  placeholderPolicy,
  policyRecord,
  restoredUnit,
} from './allocation-records.js';
import {
  claimOf,
  EPSILON,
  inFlight,
  newPolicyState,
  restingUnit,
  unitsOf,
  type MoveCause,
  type PolicyState,
  type Unit,
} from './allocation-state.js';
import { allocationView, regionView, type AllocationView, type RegionView } from './allocation-views.js';
import { ConservationSteps } from './conservation-steps.js';
import {
  DEMAND_SNAPSHOT_INTERVAL_MS,
  DEMAND_SNAPSHOT_MAX_AGE_MS,
  dropSeed,
  emptySnapshot,
  restoreDemandSnapshot,
  seedKey,
  takeDemandSnapshot,
  type DemandSnapshot,
  type SnapshotOutcome,
} from './demand-snapshot.js';
import { zeroCounters, type EngineCounters } from './engine-counters.js';
import { ackTimeoutMs, defaultLeaseSettings, LeaseSettings, type LeaseSettingsInput } from './settings.js';
import { SubjectOverrides } from './subject-overrides.js';

/**
 * Learning mode lasts at least this many report intervals after the first heartbeat a coordinator hears (it is
 * listening by then): an agent sends its next heartbeat at most one interval after the previous one ended, which
 * waited at most one interval for a reply, and a heartbeat crosses in less than one interval (agents ignore replies
 * later than that), so every agent that can reach the new coordinator has been heard by then. The interval is
 * the longer of the coordinator's and the agents' own default: an agent no coordinator has renewed yet (one
 * started while none answered) heartbeats on its default interval, not on one it was never told.
 */
export const LEARNING_REPORT_INTERVALS = 3;

/** Allocations of removed policies kept, so that one created again moves from its last shares (upsertPolicy). */
export const REMOVED_POLICIES_KEPT = 1024;

export interface LeaseCoordinatorOptions {
  coordinatorId: string;
  /** The configured regions, in a fixed order. */
  regions: readonly string[];
  clock: Clock;
  rebalance?: RebalanceSettingsInput | undefined;
  lease?: LeaseSettingsInput | undefined;
  /** Safe static shares by region (sum ≤ 1). Default: equal split. */
  safeShares?: Readonly<Record<string, number>> | undefined;
  /** Allocation records persisted by an earlier incarnation, with their KV revisions. */
  records?: ReadonlyArray<{ record: AllocationRecord; revision: number }>;
  /** Agents an earlier incarnation registered. */
  agents?: readonly AgentRegistration[];
  /**
   * False when the registry read at start skipped an entry (one that did not parse, or of a region this
   * coordinator does not run): an agent that may hold an earlier incarnation's lease is then unknown, and learning
   * lasts its whole lease + skew. Default true.
   */
  registryComplete?: boolean | undefined;
  /**
   * Demand snapshots the leader before wrote (demand-snapshot.ts): a policy restored from its record starts from
   * its predecessor's demand and move state instead of from nothing.
   */
  demandSnapshots?: readonly DemandSnapshot[];
  /** Ignore a snapshot older than this, ms. Default DEMAND_SNAPSHOT_MAX_AGE_MS. */
  snapshotMaxAgeMs?: number | undefined;
  /** Write a policy's snapshot at most this often, ms. Default DEMAND_SNAPSHOT_INTERVAL_MS. */
  snapshotIntervalMs?: number | undefined;
}

/** A demand snapshot the shell must persist (or delete, when `snapshot` is null). */
export interface SnapshotWrite {
  policy: string;
  snapshot: DemandSnapshot | null;
}

/** A record the shell must persist (or delete, when `record` is null). */
export interface RecordWrite {
  policy: string;
  record: AllocationRecord | null;
  /** Pass back to `written()` with the KV revision. */
  seq: number;
}

export class LeaseCoordinator {
  readonly coordinatorId: string;
  readonly regions: readonly string[];
  readonly settings: RebalanceSettings;
  readonly lease: LeaseSettings;
  readonly safe: readonly number[];
  readonly counters: EngineCounters = zeroCounters();
  /** What became of each demand snapshot given at construction, by outcome. */
  readonly snapshotOutcomes = new Map<SnapshotOutcome, number>();

  readonly #clock: Clock;
  readonly #regionIndex: Map<string, number>;
  readonly #policies = new Map<string, PolicyState>();
  readonly #roster: AgentRoster;
  readonly #overrides: SubjectOverrides;
  readonly #steps: ConservationSteps;
  readonly #dirty = new Set<string>();
  readonly #deleted = new Set<string>();
  readonly #snapshotsDeleted = new Set<string>();
  /** Allocations of removed policies, the most recent first kept: one created again carries on from its own. */
  readonly #removed = new Map<string, PolicyState>();
  readonly #snapshotIntervalMs: number;
  readonly #lastReportAt: (number | undefined)[];
  /** When each region's last usage report arrived: a region silent for long has unknown demand, not zero. */
  readonly #lastUsageAt: (number | undefined)[];
  #learningUntil: number;
  /** When the first heartbeat reached this incarnation: learning lasts LEARNING_REPORT_INTERVALS more at least. */
  #firstHeardAt: number | undefined;
  /** The registry read at start names every agent an earlier incarnation may have renewed. */
  #registryComplete: boolean;
  /** An agent must acknowledge a shrink within this long, or it is not renewed (and lapses in time). */
  readonly #ackTimeoutMs: number;

  constructor(options: LeaseCoordinatorOptions) {
    this.coordinatorId = options.coordinatorId;
    this.regions = [...options.regions];
    if (this.regions.length === 0) throw new RangeError('at least one region is required');
    if (new Set(this.regions).size !== this.regions.length) throw new RangeError('regions must be unique');
    this.#regionIndex = new Map(this.regions.map((r, i) => [r, i]));
    this.#clock = options.clock;
    this.settings =
      options.rebalance === undefined ? defaultRebalanceSettings : RebalanceSettings.parse(options.rebalance);
    this.lease = options.lease === undefined ? defaultLeaseSettings : LeaseSettings.parse(options.lease);
    this.#ackTimeoutMs = ackTimeoutMs(this.lease, this.settings.roundMs);
    this.safe = this.regions.map((r) => ownValue(options.safeShares, r) ?? 1 / this.regions.length);
    const safeSum = this.safe.reduce((a, b) => a + b, 0);
    if (this.safe.some((s) => !(s >= 0 && s <= 1)) || safeSum > 1 + EPSILON) {
      throw new RangeError(`safe shares must be in [0, 1] and sum to at most 1 (got ${safeSum})`);
    }
    this.#roster = new AgentRoster(this.lease, this.regions.length);
    this.#overrides = new SubjectOverrides({
      settings: this.settings,
      lease: this.lease,
      regionCount: this.regions.length,
      counters: this.counters,
      touch: (state) => this.#touch(state),
      trackPending: (unit, state) => this.#steps.track(unit, state),
    });
    this.#steps = new ConservationSteps({
      safe: this.safe,
      counters: this.counters,
      roster: this.#roster,
      learning: (now) => this.learning(now),
      touch: (state) => this.#touch(state),
    });
    this.#lastReportAt = this.regions.map(() => undefined);
    this.#lastUsageAt = this.regions.map(() => undefined);
    const now = this.#clock.now();
    // Learning mode: an earlier incarnation may have renewed leases up to one lease ago. It ends sooner once every
    // agent of the registry holds a renewal of this incarnation, but not before every agent that can reach this one
    // has been heard (see `#endLearning`).
    this.#learningUntil = now + this.lease.leaseMs + this.lease.skewMs;
    this.#registryComplete = options.registryComplete ?? true;
    for (const reg of options.agents ?? []) {
      const region = this.#regionIndex.get(reg.region);
      if (region !== undefined) this.#roster.restore(reg, region, now);
      else this.#registryComplete = false;
    }
    for (const { record, revision } of options.records ?? []) this.#restore(record, revision);
    // Before the budget is restored: a snapshot's move state applies to the shares its record left.
    this.#snapshotIntervalMs = options.snapshotIntervalMs ?? DEMAND_SNAPSHOT_INTERVAL_MS;
    const maxAgeMs = options.snapshotMaxAgeMs ?? DEMAND_SNAPSHOT_MAX_AGE_MS;
    for (const snapshot of options.demandSnapshots ?? []) {
      const state = this.#policies.get(snapshot.policy);
      const outcome =
        state === undefined
          ? 'unknown_policy'
          : restoreDemandSnapshot(this.regions, state, snapshot, now, maxAgeMs, this.lease.skewMs);
      this.snapshotOutcomes.set(outcome, (this.snapshotOutcomes.get(outcome) ?? 0) + 1);
    }
    // Agents of the earlier incarnation may be holding their safe shares: make the claims fit before anyone is
    // renewed (the shell persists these writes before it answers heartbeats).
    const lapsed = this.#lapsedByRegion(now);
    for (const state of this.#policies.values()) {
      for (const unit of unitsOf(state)) this.#steps.restoreBudget(state, unit, lapsed, now);
    }
  }

  /** True while the coordinator grows nothing after a (re)start. */
  learning(now = this.#clock.now()): boolean {
    return now < this.#learningUntil;
  }

  /**
   * End learning mode early once nothing is left to learn: every agent of the registry reported holding a renewal
   * of this incarnation (so its share is one this incarnation's claims bound, whatever an earlier one granted), and
   * at least LEARNING_REPORT_INTERVALS report intervals passed since the first heartbeat it heard (every agent that
   * can reach this coordinator, one the registry does not name included, has been heard by then and is counted,
   * at its safe share until it holds a renewal of this incarnation). Sound
   * because no renewal is sent before its agent's registration is persisted (`awaitsRegistration`): an agent that
   * may hold a lease of an earlier incarnation is in the registry this one read. docs/protocol.md, "Restart".
   */
  #endLearning(now: number): void {
    if (now >= this.#learningUntil || this.#firstHeardAt === undefined || !this.#registryComplete) return;
    const intervalMs = Math.max(this.lease.reportIntervalMs, defaultLeaseSettings.reportIntervalMs);
    if (now < this.#firstHeardAt + LEARNING_REPORT_INTERVALS * intervalMs) return;
    if (!this.#roster.allRenewed(now)) return;
    this.#learningUntil = now;
    this.counters.learningEndedEarly++;
  }

  // ---- policies -------------------------------------------------------------------------------------------

  /** A policy was created or changed. Regional policies get (or keep) an allocation; others lose theirs. */
  upsertPolicy(policy: Policy): void {
    const existing = this.#policies.get(policy.name);
    if (policy.mode !== 'regional') {
      if (existing !== undefined) this.removePolicy(policy.name);
      return;
    }
    const floor = shareFloor(policy.capacity, policy.maxCost, policy.minShare, this.settings);
    if (existing !== undefined) {
      existing.policy = policy;
      existing.floor = floor;
      this.#touch(existing);
      return;
    }
    // A policy removed and back (deleted and created again, or regional → local → regional) carries on from the
    // shares it had: agents may still be deciding under its last record (decisions in flight, a watch behind),
    // so its regions move by the protocol's shrinks and grows, not at once to the safe shares.
    const removed = this.#removed.get(policy.name);
    if (removed !== undefined) {
      this.#removed.delete(policy.name);
      removed.policy = policy;
      removed.floor = floor;
      this.#steps.revived(removed);
    }
    const state = removed ?? this.#newState(policy, restingUnit(this.safe));
    this.#policies.set(policy.name, state);
    this.#deleted.delete(policy.name);
    this.#touch(state);
  }

  removePolicy(name: string): void {
    const state = this.#policies.get(name);
    if (state === undefined) return;
    this.#steps.removed(state);
    this.#removed.delete(name);
    this.#removed.set(name, state);
    if (this.#removed.size > REMOVED_POLICIES_KEPT) this.#removed.delete(this.#removed.keys().next().value!);
    this.#policies.delete(name);
    this.#dirty.delete(name);
    this.#deleted.add(name);
    this.#snapshotsDeleted.add(name);
  }

  // ---- messages -------------------------------------------------------------------------------------------

  /** A heartbeat: register or refresh the agent, record its progress, and answer with a renewal or a refusal. */
  /**
   * `credential`: the tag of the credential the heartbeat came with (its subject's), when known; a new agent
   * replaces an old one of the same instance name only when both came with the same credential.
   */
  heartbeat(hb: Heartbeat, credential?: string, legacy = false): RenewalReply {
    const now = this.#clock.now();
    const region = this.#regionIndex.get(hb.region);
    if (region === undefined) {
      this.counters.renewalsRefused++;
      return { refused: `unknown region ${hb.region}` };
    }
    this.#firstHeardAt ??= now;
    const agent = this.#roster.heard(
      {
        agentId: hb.agentId,
        instance: hb.instance,
        region,
        regionName: hb.region,
        appliedRevision: hb.appliedRevision,
        ackRevision: hb.ackRevision,
        renewedSeq: hb.renewedSeq,
        shed: hb.shed,
        credential,
        legacy,
      },
      now,
    );
    if ('refused' in agent) {
      this.counters.renewalsRefused++;
      return agent;
    }
    this.#lastReportAt[region] = now;
    this.#steps.settle(region, now);
    if (this.#roster.possiblyLapsed(agent, now) && this.#steps.unwrittenIn(region)) {
      // A renewal must not lift it above its safe share before the shrink that makes room is visible.
      this.counters.renewalsRefused++;
      return { refused: 'catching up: a shrink of this region is being written; retry' };
    }
    if (this.#unwrittenOverdue(region, now)) {
      // Nobody here can acknowledge a shrink that is not written: let them lapse to min(issued, safe) in time.
      this.counters.renewalsRefused++;
      return { refused: 'shrink not written in time: a shrink of this region is overdue in the KV; retry' };
    }
    if (this.#roster.overdue(agent, now, this.#ackTimeoutMs)) {
      this.counters.renewalsRefused++;
      return {
        refused: 'acknowledgement overdue: finish in-flight decisions and acknowledge the latest records',
      };
    }
    this.#roster.grant(agent, hb.seq, now);
    this.#endLearning(now);
    return {
      coordinatorId: this.coordinatorId,
      leaseMs: this.lease.leaseMs,
      graceMs: this.lease.graceMs,
      minRevision: this.#steps.minRevision(region),
      learning: this.learning(now),
      reportIntervalMs: this.lease.reportIntervalMs,
    };
  }

  /**
   * The renewal just answered to `agentId` must not be sent before its registration is persisted: the shell
   * writes the registry (`takeRegistryWrites`) first, calls `registered`, then sends it. A successor reads the
   * registry to know which agents may hold a lease, and ends learning mode early on that (`#endLearning`).
   */
  awaitsRegistration(agentId: string): boolean {
    return this.#roster.get(agentId)?.registered === false;
  }

  /** The registration of `agentId` is persisted (renewals held for it may be sent). */
  registered(agentId: string): void {
    this.#roster.registrationWritten(agentId);
  }

  /** Writing the registration of `agentId` failed: it comes back in `takeRegistryWrites` (held renewals are dropped). */
  registrationFailed(agentId: string): void {
    this.#roster.registrationFailed(agentId);
  }

  /** An acknowledgement: the agent applied records up to `ackRevision` and nothing older is in flight. */
  ack(message: Ack): void {
    const agent = this.#roster.get(message.agentId);
    if (agent === undefined || this.regions[agent.region] !== message.region) {
      this.counters.messagesDropped++;
      return;
    }
    if (!this.#roster.acknowledged(agent, message.ackRevision)) return;
    this.#steps.settle(agent.region, this.#clock.now());
  }

  /** An agent leaving gracefully: it holds nothing any more. */
  bye(message: Bye): void {
    const agent = this.#roster.get(message.agentId);
    if (agent === undefined || this.regions[agent.region] !== message.region) {
      this.counters.messagesDropped++;
      return;
    }
    this.#roster.forget(agent.id);
    this.#steps.settle(agent.region, this.#clock.now());
  }

  /**
   * Usage of one agent over one interval (one chunk of it). Only a registered agent of that region moves demand:
   * an id the coordinator has not renewed (or forgot) could be anyone's. False when the message is dropped.
   */
  usage(message: Usage): boolean {
    const now = this.#clock.now();
    const region = this.#regionIndex.get(message.region);
    const agent = this.#roster.get(message.agentId);
    if (region === undefined || agent === undefined || agent.region !== region) {
      this.counters.messagesDropped++;
      return false;
    }
    this.#lastReportAt[region] = now;
    this.#lastUsageAt[region] = now;
    const key = `${region}/${message.agentId}`;
    for (const u of message.policies) {
      const state = this.#policies.get(u.policy);
      if (state === undefined) continue;
      // The region's own reports replace what a predecessor's snapshot seeded.
      if (state.demand.lastSeen(seedKey(region)) !== undefined) dropSeed(state, region);
      const demand = u.demand ?? u.requested;
      state.demand.observe(key, demand, message.intervalMs, now, region);
      state.slowDemand.observe(key, demand, message.intervalMs, now, region);
      // Unmet here: refused within the subjects' limits, and what other regions' refill had to cover (borrowed).
      const unmet = Math.min(demand, Math.max(0, demand - u.admitted) + (u.imported ?? 0));
      state.unmet.observe(key, unmet, message.intervalMs, now, region);
      // A subject's demand here counts its refusals only up to its own rate (core/shares/usage-accounting.ts).
      const allowance = (state.policy.refillPerSecond * message.intervalMs) / 1000;
      const own = (c: { requested: number; denied: number }) =>
        subjectDemand(c.requested, c.requested - c.denied, allowance);
      for (const c of u.constrained) {
        this.#overrides.observe(state, key, region, c.subject, own(c), c.denied, message.intervalMs, now);
      }
      // Watched subjects come with their demand here even when they were not constrained (zero included).
      const constrained = new Set(u.constrained.map((c) => c.subject));
      for (const w of u.watched ?? []) {
        if (constrained.has(w.subject) || !state.watchedSince.has(w.subject)) continue;
        this.#overrides.observe(state, key, region, w.subject, own(w), w.denied, message.intervalMs, now);
      }
    }
    return true;
  }

  // ---- writes ---------------------------------------------------------------------------------------------

  /** Records to persist since the last call, and deletions. */
  takeWrites(): RecordWrite[] {
    const out: RecordWrite[] = [];
    for (const name of this.#deleted) out.push({ policy: name, record: null, seq: 0 });
    this.#deleted.clear();
    for (const name of this.#dirty) {
      const state = this.#policies.get(name);
      if (state !== undefined) {
        const now = this.#clock.now();
        const windowMs = lowestWindowMs(state, this.lease.skewMs);
        out.push({
          policy: name,
          record: policyRecord(this.regions, this.safe, state, now, windowMs, !this.#roster.anyLegacy()),
          seq: state.seq,
        });
      }
    }
    this.#dirty.clear();
    return out;
  }

  /** The shell persisted the record of `policy` as of change `seq`, at KV `revision`. */
  written(policy: string, seq: number, revision: number): void {
    const state = this.#policies.get(policy);
    if (state === undefined) return;
    this.#steps.written(state, seq, revision, this.#clock.now());
  }

  /** The write of `policy` failed: it will be taken again. */
  writeFailed(policy: string): void {
    if (this.#policies.has(policy)) this.#dirty.add(policy);
    else this.#deleted.add(policy);
  }

  /**
   * Demand snapshots due: each regional policy's at most once per snapshot interval (none while it has nothing a
   * successor could use and had nothing at the last), and a deletion for each removed policy.
   */
  takeDemandSnapshots(): SnapshotWrite[] {
    const now = this.#clock.now();
    const out: SnapshotWrite[] = [];
    for (const name of this.#snapshotsDeleted) out.push({ policy: name, snapshot: null });
    this.#snapshotsDeleted.clear();
    for (const state of this.#policies.values()) {
      if (state.snapshotAt !== undefined && now - state.snapshotAt < this.#snapshotIntervalMs) continue;
      const snapshot = takeDemandSnapshot(this.regions, state, now);
      const empty = emptySnapshot(snapshot);
      if (empty && state.snapshotEmpty === true) continue;
      state.snapshotAt = now;
      state.snapshotEmpty = empty;
      out.push({ policy: state.policy.name, snapshot });
    }
    return out;
  }

  /** Agent registry changes to persist since the last call. */
  takeRegistryWrites(): RegistryWrite[] {
    return this.#roster.takeWrites();
  }

  // ---- the round ------------------------------------------------------------------------------------------

  /** One rebalancing round: settle lapsed agents, restore the budget if needed, then step toward demand. */
  tick(): void {
    const now = this.#clock.now();
    this.counters.rounds++;
    this.counters.agentsForgotten += this.#roster.forgetSilent(now);
    this.#endLearning(now);
    for (let r = 0; r < this.regions.length; r++) this.#steps.settle(r, now);
    const lapsed = this.#lapsedByRegion(now);
    const unreachable = this.regions.map((_, r) => this.#roster.unreachable(r, now));
    const learning = this.learning(now);
    const legacy = this.#roster.anyLegacy();
    for (const state of this.#policies.values()) {
      this.#round(state, undefined, state.base, lapsed, unreachable, learning, now);
      for (const [subject, unit] of state.overrides) {
        this.#round(state, subject, unit, lapsed, unreachable, learning, now);
      }
      if (!learning && (state.subjects.size > 0 || state.overrides.size > 0)) {
        this.#overrides.manage(state, now);
      }
      if (this.counters.rounds % 10 === 0) {
        state.demand.prune(now, 60_000);
        state.unmet.prune(now, 60_000);
        state.slowDemand.prune(now, 60_000);
      }
      if (state.subjects.size > 0) this.#overrides.prune(state, now);
      // A lowest share that aged out of the window: the record is written again without it.
      const windowMs = lowestWindowMs(state, this.lease.skewMs);
      if (unitsOf(state).some((unit) => lowestChanged(unit, now, windowMs, legacy)))
        this.#dirty.add(state.policy.name);
    }
  }

  #round(
    state: PolicyState,
    subject: string | undefined,
    unit: Unit,
    lapsed: readonly boolean[],
    unreachable: readonly boolean[],
    learning: boolean,
    now: number,
  ): void {
    // Without lapsed agents the claims settle at the issued shares, which never sum above 1: nothing to restore.
    if (lapsed.includes(true)) {
      const epoch = unit.epoch;
      if (unreachable.includes(true)) this.#steps.releaseUnreachable(state, unit, unreachable, now);
      this.#steps.restoreBudget(state, unit, lapsed, now);
      if (unit.epoch !== epoch) unit.cause = this.#cause('lapsed_region', state, now, undefined);
    }
    if (learning || inFlight(unit)) return;
    let next: number[] | undefined;
    let cause: MoveCause | undefined;
    if (subject !== undefined && state.reverting.has(subject)) {
      // Head back to the policy's shares; the override is dropped once it matches them.
      const far = unit.shares.some((s, r) => Math.abs(s - state.base.shares[r]!) > EPSILON);
      next = far ? [...state.base.shares] : undefined;
      unit.moving = next !== undefined;
    } else {
      const entry = subject === undefined ? undefined : state.subjects.get(subject);
      if (subject !== undefined && entry === undefined) return;
      const cooldown = this.#cooldown(state, now);
      let ideal: number[] | undefined;
      if (entry === undefined) {
        const demand = this.#roundDemand(state, now);
        ideal = targetShares(
          unit.shares,
          demand,
          state.floor,
          negligibleDemand(state.policy.refillPerSecond),
        );
        next = rebalanceRound(unit, ideal, state.floor, this.settings, { now, demand }, cooldown);
        if (next !== undefined) {
          cause = { reason: 'demand', demand: demand.demand, unmet: demand.unmet, target: ideal };
        }
      } else {
        ideal = this.#overrides.ideal(state, entry, now);
        next = rebalanceRound(unit, ideal, state.floor, this.settings, undefined, cooldown);
      }
      // No step due, but part of the budget unallocated (a lapse restored around, a record of an earlier
      // incarnation): hand it out. Not while some region is lapsed: its safe share holds that part back.
      if (next === undefined && !lapsed.includes(true)) {
        next = wholeShares(unit, ideal, cooldown);
        if (next !== undefined) cause = this.#cause('unallocated', state, now, ideal);
      }
    }
    // A region below the floor (raised by a policy change) cannot admit the largest cost: lift it whatever the
    // demand, which alone would wait for refusals to show room is needed. Not while some region is lapsed: its
    // safe share holds that part back.
    if (next === undefined && !lapsed.includes(true)) next = liftToFloor(unit.shares, state.floor);
    if (next !== undefined) {
      const epoch = unit.epoch;
      this.#steps.step(state, unit, next, now, lapsed);
      // A step whose grows found no room changed nothing: what moved the shares last still stands.
      if (unit.epoch !== epoch || inFlight(unit)) unit.cause = cause;
    }
  }

  /** A move's cause with the demand this round sees. */
  #cause(
    reason: MoveCause['reason'],
    state: PolicyState,
    now: number,
    target: number[] | undefined,
  ): MoveCause {
    const { demand, unmet } = this.#roundDemand(state, now);
    return { reason, demand, unmet, target };
  }

  /** The regrowth cool-down of a policy's units: its idle TTL, padded by the clock-skew margin on both sides. */
  #cooldown(state: PolicyState, now: number): Cooldown {
    return { now, ms: state.policy.idleTtlSeconds * 1000 + 2 * this.lease.skewMs };
  }

  // ---- views ----------------------------------------------------------------------------------------------

  /** Shares in force claimed by each region for a policy's default vector (what the budget check uses). */
  claims(policy: string, subject?: string): Record<string, number> | undefined {
    const state = this.#policies.get(policy);
    const unit =
      state === undefined ? undefined : subject === undefined ? state.base : state.overrides.get(subject);
    if (unit === undefined) return undefined;
    const now = this.#clock.now();
    return Object.fromEntries(
      this.regions.map((r, i) => [r, claimOf(unit, i, this.#roster.lapsedIn(i, now), this.safe[i]!)]),
    );
  }

  allocations(): AllocationView[] {
    const now = this.#clock.now();
    return [...this.#policies.values()].map((state) =>
      allocationView(
        this.regions,
        state,
        this.#roster,
        (subject) => this.#overrides.expiresAt(state, subject),
        now,
      ),
    );
  }

  regionViews(): RegionView[] {
    const now = this.#clock.now();
    return this.regions.map((region, r) => regionView(region, r, this.#roster, this.#lastReportAt[r], now));
  }

  /** Forget an agent on an operator's word (it is gone for good). */
  forgetAgent(agentId: string): boolean {
    const agent = this.#roster.get(agentId);
    if (agent === undefined) return false;
    this.#roster.forget(agentId);
    this.#steps.settle(agent.region, this.#clock.now());
    return true;
  }

  /** Names of the policies with an allocation (restored or upserted). */
  policyNames(): string[] {
    return [...this.#policies.keys()];
  }

  get policyCount(): number {
    return this.#policies.size;
  }

  // ---- internals ------------------------------------------------------------------------------------------

  #newState(policy: Policy, base: Unit): PolicyState {
    return newPolicyState(policy, base, this.settings, this.#clock.now());
  }

  #restore(record: AllocationRecord, revision: number): void {
    const now = this.#clock.now();
    const state = this.#newState(
      placeholderPolicy(record),
      restoredUnit(this.regions, record.default, revision, now),
    );
    state.epoch = record.epoch;
    for (const [subject, u] of Object.entries(record.overrides)) {
      state.overrides.set(subject, restoredUnit(this.regions, u, revision, now));
    }
    this.#steps.restored(state, revision);
    this.#policies.set(record.policy, state);
  }

  #touch(state: PolicyState): void {
    state.seq++;
    state.epoch++;
    state.updatedAt = this.#clock.now();
    this.#dirty.add(state.policy.name);
  }

  /**
   * Demand of a policy by region for this round. A region is known when it sent usage within three report
   * intervals (agents send one every interval, a policy without decisions counting as zero demand); one not
   * heard from yet, or cut off, is unknown and keeps its share.
   */
  #roundDemand(state: PolicyState, now: number): RoundDemand {
    const stale = 3 * this.lease.reportIntervalMs;
    return {
      demand: state.demand.sumByTag(now, this.#zeros()),
      unmet: state.unmet.sumByTag(now, this.#zeros()),
      known: this.#lastUsageAt.map((at) => at !== undefined && now - at <= stale),
    };
  }

  /**
   * A shrink of `region` has gone unwritten for longer than the acknowledgement deadline, counted from its issue,
   * while some agent may be lapsed. The claims count on every issued shrink (restoreBudget counts what they settle
   * at), and an agent that lapsed takes its safe share when its grace period ends, whether or not the KV took the
   * write: the agents of `region` must then lapse too, and they can only if they stop being renewed. Without a
   * lapsed agent the claims hold whatever the KV does (a shrinking region counts at its old share until
   * acknowledged), so a KV outage alone refuses nobody. docs/protocol.md, "Lapsed agents".
   */
  #unwrittenOverdue(region: number, now: number): boolean {
    const since = this.#steps.unwrittenSince(region);
    if (since === undefined || now - since <= this.#ackTimeoutMs) return false;
    for (let r = 0; r < this.regions.length; r++) if (this.#roster.lapsedIn(r, now)) return true;
    return false;
  }

  #lapsedByRegion(now: number): boolean[] {
    return this.regions.map((_, r) => this.#roster.lapsedIn(r, now));
  }

  #zeros(): number[] {
    return new Array<number>(this.regions.length).fill(0);
  }
}
