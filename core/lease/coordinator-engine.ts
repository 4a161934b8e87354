/**
 * The coordinator's side of the conservation protocol, pure: it owns the shares of every regional policy (and of
 * per-subject overrides), renews agents' leases, and moves shares toward demand without ever letting the shares
 * in force add up to more than the budget. The NATS/KV shell (coordinator/protocol/) feeds it messages and time,
 * and persists what it asks to; the simulator feeds it a simulated network.
 *
 * Conservation, per allocation unit (a policy's default vector, or one subject's override):
 *   claim(r) = max(issued share of r, share r held before an unacknowledged shrink, safe share of r if some agent
 *              of r has let its lease lapse)
 * and Σ claim ≤ 1 always holds: shrinks are issued first and count at their old value until every agent of the
 * region acknowledges the record revision that carries them (or its lease lapses: then it holds at most its
 * safe share); grows are issued only into the room the claims leave. When an agent lapses, an agent in that
 * region may move to its safe share after the grace period; the coordinator then shrinks live regions until
 * the claims fit again, and stops renewing agents that do not acknowledge in time, so they lapse too before
 * the grace period ends. A restarted coordinator grows nothing for one lease (learning mode).
 */
import type { Clock } from '../clock.js';
import type { Policy } from '../policy.js';
import { DemandTracker } from '../rebalance/demand.js';
import {
  defaultRebalanceSettings,
  RebalanceSettings,
  type RebalanceSettingsInput,
} from '../rebalance/settings.js';
import {
  idealShares,
  idealSharesWithin,
  rebalanceRound,
  shareFloor,
  stepToward,
} from '../rebalance/target.js';
import { MAX_WATCHED_PER_POLICY } from '../wire/protocol.js';
import type {
  Ack,
  AgentRegistration,
  AllocationRecord,
  Bye,
  Heartbeat,
  RenewalReply,
  UnitRecord,
  Usage,
} from '../wire/protocol.js';
import { defaultLeaseSettings, LeaseSettings, type LeaseSettingsInput } from './settings.js';

/** Shares closer than this are equal. */
const EPSILON = 1e-9;
/** A subject's demand is smoothed over this many times a policy's half-life. */
const SUBJECT_SMOOTHING = 3;
/** Subjects tracked per policy for overrides, per override slot. */
const SUBJECTS_PER_OVERRIDE_SLOT = 4;

export interface CoordinatorEngineOptions {
  coordinatorId: string;
  /** The configured regions, in a fixed order. */
  regions: readonly string[];
  clock: Clock;
  rebalance?: RebalanceSettingsInput;
  lease?: LeaseSettingsInput;
  /** Safe static shares by region (sum ≤ 1). Default: equal split. */
  safeShares?: Readonly<Record<string, number>>;
  /** Allocation records persisted by an earlier incarnation, with their KV revisions. */
  records?: ReadonlyArray<{ record: AllocationRecord; revision: number }>;
  /** Agents an earlier incarnation registered. */
  agents?: readonly AgentRegistration[];
}

/** A record the shell must persist (or delete, when `record` is null). */
export interface RecordWrite {
  policy: string;
  record: AllocationRecord | null;
  /** Pass back to `written()` with the KV revision. */
  seq: number;
}

/** A change of the agent registry the shell must persist. */
export type RegistryWrite = { put: AgentRegistration } | { delete: string };

interface Agent {
  id: string;
  instance: string;
  region: number;
  registeredAt: number;
  /** Coordinator time until which the agent may hold a lease; 0 when never renewed by this incarnation. */
  leaseUntil: number;
  lastHeartbeatAt: number | undefined;
  appliedRevision: number;
  ackRevision: number;
  /** When this incarnation granted renewals, by heartbeat seq (the last few). */
  grants: Map<number, number>;
  /**
   * Coordinator time until which the agent surely holds a valid lease: the grant of the renewal it reports
   * holding, plus the lease, minus the longest a reply may take to count (a report interval) and the skew.
   */
  surelyValidUntil: number;
}

interface Unit {
  shares: number[];
  /** Share held before an unacknowledged shrink, by region. */
  pending: (number | undefined)[];
  /** KV revision that carries the pending shrinks (undefined until written). */
  pendingRevision: number | undefined;
  /** Change sequence of the pending shrinks (matches a write to its revision). */
  pendingSeq: number;
  /** Coordinator time at which the pending revision became known (for the acknowledgement deadline). */
  pendingSince: number;
  /** Where a rebalance in flight is heading: grows wait for the shrinks to be acknowledged. */
  target: number[] | undefined;
  /** A rebalance is under way: it continues until within the settle band (hysteresis has two thresholds). */
  moving: boolean;
  /** The target of the last round, to tell whether it is still moving. */
  lastIdeal?: number[] | undefined;
  epoch: number;
}

interface SubjectDemand {
  tracker: DemandTracker<string>;
  lastDeniedAt: number;
  deniedRate: number;
}

interface PolicyState {
  policy: Policy;
  floor: number;
  base: Unit;
  overrides: Map<string, Unit>;
  reverting: Set<string>;
  epoch: number;
  /** Bumped on every change; a write carries the seq it snapshots. */
  seq: number;
  /** Regions whose share shrank, by change seq, until the write carrying them is confirmed. */
  unwrittenShrinks: { seq: number; regions: number[] }[];
  demand: DemandTracker<string>;
  /**
   * The policy's demand smoothed like a subject's (slower): a subject's shape is compared with this, so a shift
   * of the whole policy, which subjects' slower estimates follow late, does not look like subjects of their own.
   */
  slowDemand: DemandTracker<string>;
  subjects: Map<string, SubjectDemand>;
  /** Subjects agents are asked to report every interval (written in the record). */
  watch: string[];
  /** When each watched subject joined the list: it needs a full report round before it can get an override. */
  watchedSince: Map<string, number>;
  updatedAt: number;
}

/** An agent not heard from yet by this incarnation: possibly lapsed until it reports a renewal granted here. */
function newAgent(
  id: string,
  instance: string,
  region: number,
  registeredAt: number,
  leaseUntil: number,
): Agent {
  return {
    id,
    instance,
    region,
    registeredAt,
    leaseUntil,
    lastHeartbeatAt: undefined,
    appliedRevision: 0,
    ackRevision: 0,
    grants: new Map(),
    surelyValidUntil: -Infinity,
  };
}

function maxGap(a: readonly number[], b: readonly number[]): number {
  let gap = 0;
  for (let i = 0; i < a.length; i++) gap = Math.max(gap, Math.abs(a[i]! - b[i]!));
  return gap;
}

/** Allocation of one policy, as the admin API shows it. */
export interface AllocationView {
  policy: string;
  version: number;
  epoch: number;
  shares: Record<string, number>;
  leases: Record<string, { expiresAt: number | null; acked: boolean }>;
  /** `expiresAt`: when the override starts reverting unless its subject is constrained again. */
  overrides: { subject: string; epoch: number; shares: Record<string, number>; expiresAt: number | null }[];
}

/** One region, as the admin API shows it. */
export interface RegionView {
  region: string;
  agents: {
    agentId: string;
    instance: string;
    lastHeartbeatAt: number | null;
    leaseUntil: number | null;
    appliedRevision: number;
    ackRevision: number;
    lapsed: boolean;
  }[];
  lastReportAt: number | null;
  lagMs: number | null;
}

/** Counters the shell exports as metrics. */
export interface EngineCounters {
  rounds: number;
  shrinks: number;
  grows: number;
  safetyShrinks: number;
  overridesCreated: number;
  overridesRemoved: number;
  renewalsRefused: number;
  messagesDropped: number;
}

/** Every counter at zero. */
export function zeroCounters(): EngineCounters {
  return {
    rounds: 0,
    shrinks: 0,
    grows: 0,
    safetyShrinks: 0,
    overridesCreated: 0,
    overridesRemoved: 0,
    renewalsRefused: 0,
    messagesDropped: 0,
  };
}

export class CoordinatorEngine {
  readonly coordinatorId: string;
  readonly regions: readonly string[];
  readonly settings: RebalanceSettings;
  readonly lease: LeaseSettings;
  readonly safe: readonly number[];
  readonly counters: EngineCounters = zeroCounters();

  readonly #clock: Clock;
  readonly #regionIndex: Map<string, number>;
  readonly #policies = new Map<string, PolicyState>();
  readonly #agents = new Map<string, Agent>();
  readonly #dirty = new Set<string>();
  /** Units with pending shrinks, and their policy: acknowledgements only look at these. */
  readonly #pendingUnits = new Map<Unit, PolicyState>();
  readonly #deleted = new Set<string>();
  #registryWrites: RegistryWrite[] = [];
  /** Per region: KV revision of the latest write that shrank it; an agent's lease counts once it applied this. */
  readonly #shrinkHighWater: number[];
  /** Per region: shrinks issued but not yet written (agents returning from a lapse wait for them). */
  readonly #unwrittenShrinkCount: number[];
  /** Per region: shrinks agents must acknowledge, with the time they became visible. */
  readonly #requiredAcks: { revision: number; since: number }[][];
  readonly #lastReportAt: (number | undefined)[];
  #learningUntil: number;
  /** An agent must acknowledge a shrink within this long, or it is not renewed (and lapses in time). */
  readonly #ackTimeoutMs: number;

  constructor(options: CoordinatorEngineOptions) {
    this.coordinatorId = options.coordinatorId;
    this.regions = [...options.regions];
    if (this.regions.length === 0) throw new RangeError('at least one region is required');
    if (new Set(this.regions).size !== this.regions.length) throw new RangeError('regions must be unique');
    this.#regionIndex = new Map(this.regions.map((r, i) => [r, i]));
    this.#clock = options.clock;
    this.settings =
      options.rebalance === undefined ? defaultRebalanceSettings : RebalanceSettings.parse(options.rebalance);
    this.lease = options.lease === undefined ? defaultLeaseSettings : LeaseSettings.parse(options.lease);
    // An agent that lapses may take its safe share once the grace period ends. Before then the coordinator must
    // notice (one skew margin), shrink the live regions (one round), and any agent that does not acknowledge in
    // time must lapse too (its lease, one more skew margin): what is left is the acknowledgement deadline.
    this.#ackTimeoutMs =
      this.lease.graceMs - this.lease.leaseMs - 2 * this.lease.skewMs - this.settings.roundMs;
    if (this.#ackTimeoutMs <= 0) {
      throw new RangeError(
        'graceMs must exceed leaseMs + 2 × skewMs + roundMs, so agents that do not acknowledge a shrink lapse in time',
      );
    }
    this.safe = this.regions.map((r) => options.safeShares?.[r] ?? 1 / this.regions.length);
    const safeSum = this.safe.reduce((a, b) => a + b, 0);
    if (this.safe.some((s) => !(s >= 0 && s <= 1)) || safeSum > 1 + EPSILON) {
      throw new RangeError(`safe shares must be in [0, 1] and sum to at most 1 (got ${safeSum})`);
    }
    this.#shrinkHighWater = this.regions.map(() => 0);
    this.#requiredAcks = this.regions.map(() => []);
    this.#unwrittenShrinkCount = this.regions.map(() => 0);
    this.#lastReportAt = this.regions.map(() => undefined);
    const now = this.#clock.now();
    // Learning mode: an earlier incarnation may have renewed leases up to one lease ago.
    this.#learningUntil = now + this.lease.leaseMs + this.lease.skewMs;
    for (const reg of options.agents ?? []) {
      const region = this.#regionIndex.get(reg.region);
      if (region === undefined) continue;
      this.#agents.set(
        reg.agentId,
        newAgent(reg.agentId, reg.instance, region, reg.registeredAt, now + this.lease.leaseMs),
      );
    }
    for (const { record, revision } of options.records ?? []) this.#restore(record, revision);
    // Agents of the earlier incarnation may be holding their safe shares: make the claims fit before anyone is
    // renewed (the shell persists these writes before it answers heartbeats).
    const lapsed = this.regions.map((_, r) => this.#lapsedIn(r, now));
    for (const state of this.#policies.values()) {
      for (const unit of this.#units(state)) this.#restoreBudget(state, unit, lapsed);
    }
  }

  /** True while the coordinator grows nothing after a (re)start. */
  learning(now = this.#clock.now()): boolean {
    return now < this.#learningUntil;
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
    const state = this.#newState(policy, {
      shares: [...this.safe],
      pending: this.regions.map(() => undefined),
      pendingRevision: undefined,
      pendingSeq: 0,
      pendingSince: 0,
      target: undefined,
      moving: false,
      epoch: 0,
    });
    this.#policies.set(policy.name, state);
    this.#deleted.delete(policy.name);
    this.#touch(state);
  }

  removePolicy(name: string): void {
    const state = this.#policies.get(name);
    if (state === undefined) return;
    for (const unit of this.#units(state)) this.#pendingUnits.delete(unit);
    for (const shrink of state.unwrittenShrinks) {
      for (const r of shrink.regions) this.#unwrittenShrinkCount[r] = this.#unwrittenShrinkCount[r]! - 1;
    }
    this.#policies.delete(name);
    this.#dirty.delete(name);
    this.#deleted.add(name);
  }

  // ---- messages -------------------------------------------------------------------------------------------

  /** A heartbeat: register or refresh the agent, record its progress, and answer with a renewal or a refusal. */
  heartbeat(hb: Heartbeat): RenewalReply {
    const now = this.#clock.now();
    const region = this.#regionIndex.get(hb.region);
    if (region === undefined) {
      this.counters.renewalsRefused++;
      return { refused: `unknown region ${hb.region}` };
    }
    let agent = this.#agents.get(hb.agentId);
    if (agent !== undefined && agent.region !== region) {
      this.counters.renewalsRefused++;
      return { refused: 'agent id already registered in another region' };
    }
    if (agent === undefined) {
      // A new agent with the name of an old one replaces it: instance names are unique per live agent.
      for (const other of this.#agents.values()) {
        if (other.instance === hb.instance && other.region === region) this.#forget(other.id);
      }
      agent = newAgent(hb.agentId, hb.instance, region, now, 0);
      this.#agents.set(agent.id, agent);
      this.#registryWrites.push({
        put: { agentId: agent.id, instance: agent.instance, region: hb.region, registeredAt: now },
      });
    }
    agent.lastHeartbeatAt = now;
    agent.appliedRevision = Math.max(agent.appliedRevision, hb.appliedRevision);
    agent.ackRevision = Math.max(agent.ackRevision, hb.ackRevision);
    // The heartbeat's own lease mode is not evidence: it may have waited in a buffer through an outage while the
    // lease it describes ran out. What counts is which renewal the agent says it holds; a renewal this incarnation
    // granted at time g is held until at least g + lease - report interval - skew (agents ignore replies later
    // than one report interval), and before or after that the agent counts at its safe share.
    const granted = agent.grants.get(hb.renewedSeq);
    if (granted !== undefined) {
      agent.surelyValidUntil = Math.max(
        agent.surelyValidUntil,
        granted + this.lease.leaseMs - this.lease.reportIntervalMs - this.lease.skewMs,
      );
    }
    this.#lastReportAt[region] = now;
    this.#settle(region, now);
    if (this.#possiblyLapsed(agent, now) && this.#unwrittenShrinkIn(region)) {
      // A renewal must not lift it above its safe share before the shrink that makes room is visible.
      this.counters.renewalsRefused++;
      return { refused: 'catching up: a shrink of this region is being written; retry' };
    }
    if (this.#overdue(agent, now)) {
      this.counters.renewalsRefused++;
      return {
        refused: 'acknowledgement overdue: finish in-flight decisions and acknowledge the latest records',
      };
    }
    agent.leaseUntil = now + this.lease.leaseMs;
    agent.grants.set(hb.seq, now);
    if (agent.grants.size > 16) agent.grants.delete(agent.grants.keys().next().value!);
    return {
      coordinatorId: this.coordinatorId,
      leaseMs: this.lease.leaseMs,
      graceMs: this.lease.graceMs,
      minRevision: this.#shrinkHighWater[region]!,
      learning: this.learning(now),
      reportIntervalMs: this.lease.reportIntervalMs,
    };
  }

  /** An acknowledgement: the agent applied records up to `ackRevision` and nothing older is in flight. */
  ack(message: Ack): void {
    const agent = this.#agents.get(message.agentId);
    if (agent === undefined || this.regions[agent.region] !== message.region) {
      this.counters.messagesDropped++;
      return;
    }
    if (message.ackRevision <= agent.ackRevision) return;
    agent.ackRevision = message.ackRevision;
    this.#settle(agent.region, this.#clock.now());
  }

  /** An agent leaving gracefully: it holds nothing any more. */
  bye(message: Bye): void {
    const agent = this.#agents.get(message.agentId);
    if (agent === undefined || this.regions[agent.region] !== message.region) {
      this.counters.messagesDropped++;
      return;
    }
    this.#forget(agent.id);
    this.#settle(agent.region, this.#clock.now());
  }

  /** Usage of one agent over one interval (one chunk of it). */
  usage(message: Usage): void {
    const now = this.#clock.now();
    const region = this.#regionIndex.get(message.region);
    const agent = this.#agents.get(message.agentId);
    if (region === undefined || (agent !== undefined && agent.region !== region)) {
      this.counters.messagesDropped++;
      return;
    }
    this.#lastReportAt[region] = now;
    const key = `${region}/${message.agentId}`;
    for (const u of message.policies) {
      const state = this.#policies.get(u.policy);
      if (state === undefined) continue;
      state.demand.observe(key, u.requested, message.intervalMs, now, region);
      state.slowDemand.observe(key, u.requested, message.intervalMs, now, region);
      for (const c of u.constrained) {
        this.#observeSubject(state, key, region, c.subject, c.requested, c.denied, message.intervalMs, now);
      }
      // Watched subjects come with their demand here even when they were not constrained (zero included).
      const constrained = new Set(u.constrained.map((c) => c.subject));
      for (const w of u.watched ?? []) {
        if (constrained.has(w.subject) || !state.watchedSince.has(w.subject)) continue;
        this.#observeSubject(state, key, region, w.subject, w.requested, w.denied, message.intervalMs, now);
      }
    }
  }

  // ---- writes ---------------------------------------------------------------------------------------------

  /** Records to persist since the last call, and deletions. */
  takeWrites(): RecordWrite[] {
    const out: RecordWrite[] = [];
    for (const name of this.#deleted) out.push({ policy: name, record: null, seq: 0 });
    this.#deleted.clear();
    for (const name of this.#dirty) {
      const state = this.#policies.get(name);
      if (state !== undefined) out.push({ policy: name, record: this.#record(state), seq: state.seq });
    }
    this.#dirty.clear();
    return out;
  }

  /** The shell persisted the record of `policy` as of change `seq`, at KV `revision`. */
  written(policy: string, seq: number, revision: number): void {
    const state = this.#policies.get(policy);
    if (state === undefined) return;
    const now = this.#clock.now();
    for (const unit of this.#units(state)) {
      if (!this.#pendingUnits.has(unit)) continue;
      if (
        unit.pendingRevision === undefined &&
        unit.pending.some((p) => p !== undefined) &&
        unit.pendingSeq <= seq
      ) {
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
        this.#unwrittenShrinkCount[r] = this.#unwrittenShrinkCount[r]! - 1;
        this.#shrinkHighWater[r] = Math.max(this.#shrinkHighWater[r]!, revision);
        this.#requiredAcks[r]!.push({ revision, since: now });
      }
    }
    state.unwrittenShrinks = remaining;
    for (const unit of this.#units(state)) {
      if (!this.#pendingUnits.has(unit)) continue;
      for (let r = 0; r < this.regions.length; r++) this.#settleUnit(state, unit, r, now);
    }
  }

  /** The write of `policy` failed: it will be taken again. */
  writeFailed(policy: string): void {
    if (this.#policies.has(policy)) this.#dirty.add(policy);
    else this.#deleted.add(policy);
  }

  /** Agent registry changes to persist since the last call. */
  takeRegistryWrites(): RegistryWrite[] {
    const out = this.#registryWrites;
    this.#registryWrites = [];
    return out;
  }

  // ---- the round ------------------------------------------------------------------------------------------

  /** One rebalancing round: settle lapsed agents, restore the budget if needed, then step toward demand. */
  tick(): void {
    const now = this.#clock.now();
    this.counters.rounds++;
    this.#forgetSilent(now);
    for (let r = 0; r < this.regions.length; r++) this.#settle(r, now);
    const lapsed = this.regions.map((_, r) => this.#lapsedIn(r, now));
    const unreachable = this.regions.map((_, r) => this.#unreachable(r, now));
    const learning = this.learning(now);
    for (const state of this.#policies.values()) {
      this.#round(state, undefined, state.base, lapsed, unreachable, learning, now);
      for (const [subject, unit] of state.overrides) {
        this.#round(state, subject, unit, lapsed, unreachable, learning, now);
      }
      if (!learning && (state.subjects.size > 0 || state.overrides.size > 0))
        this.#manageOverrides(state, now);
      if (this.counters.rounds % 10 === 0) {
        state.demand.prune(now, 60_000);
        state.slowDemand.prune(now, 60_000);
      }
      if (state.subjects.size === 0) continue;
      for (const [subject, d] of state.subjects) {
        if (
          !state.overrides.has(subject) &&
          now - Math.max(d.lastDeniedAt, d.tracker.lastSeenAny()) > 2 * this.lease.overrideTtlMs
        ) {
          state.subjects.delete(subject);
        }
      }
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
      if (unreachable.includes(true)) this.#releaseUnreachable(state, unit, unreachable);
      this.#restoreBudget(state, unit, lapsed);
    }
    if (learning || this.#inFlight(unit)) return;
    let next: number[] | undefined;
    if (subject !== undefined && state.reverting.has(subject)) {
      // Head back to the policy's shares; the override is dropped once it matches them.
      const far = unit.shares.some((s, r) => Math.abs(s - state.base.shares[r]!) > EPSILON);
      next = far ? [...state.base.shares] : undefined;
      unit.moving = next !== undefined;
    } else {
      const entry = subject === undefined ? undefined : state.subjects.get(subject);
      if (subject !== undefined && entry === undefined) return;
      const ideal =
        entry === undefined
          ? idealShares(this.#regionDemand(state, now), state.floor)
          : this.#subjectIdeal(state, entry, now);
      next = rebalanceRound(unit, ideal, state.floor, this.settings);
    }
    if (next !== undefined) this.#step(state, unit, next, now, lapsed);
  }

  // ---- views ----------------------------------------------------------------------------------------------

  /** Shares in force claimed by each region for a policy's default vector (what the budget check uses). */
  claims(policy: string, subject?: string): Record<string, number> | undefined {
    const state = this.#policies.get(policy);
    const unit =
      state === undefined ? undefined : subject === undefined ? state.base : state.overrides.get(subject);
    if (unit === undefined) return undefined;
    const now = this.#clock.now();
    return Object.fromEntries(this.regions.map((r, i) => [r, this.#claim(unit, i, this.#lapsedIn(i, now))]));
  }

  allocations(): AllocationView[] {
    const out: AllocationView[] = [];
    for (const state of this.#policies.values()) {
      const leases: AllocationView['leases'] = {};
      this.regions.forEach((region, r) => {
        let expiresAt: number | null = null;
        for (const a of this.#agents.values()) {
          if (a.region === r && a.leaseUntil > 0) expiresAt = Math.max(expiresAt ?? 0, a.leaseUntil);
        }
        leases[region] = { expiresAt, acked: state.base.pending[r] === undefined };
      });
      out.push({
        policy: state.policy.name,
        version: state.policy.version,
        epoch: state.epoch,
        shares: this.#byRegion(state.base.shares),
        leases,
        overrides: [...state.overrides].map(([subject, unit]) => {
          const seen = state.subjects.get(subject)?.lastDeniedAt;
          return {
            subject,
            epoch: unit.epoch,
            shares: this.#byRegion(unit.shares),
            expiresAt: seen === undefined ? null : seen + this.lease.overrideTtlMs,
          };
        }),
      });
    }
    return out;
  }

  regionViews(): RegionView[] {
    const now = this.#clock.now();
    return this.regions.map((region, r) => {
      const agents = [...this.#agents.values()]
        .filter((a) => a.region === r)
        .map((a) => ({
          agentId: a.id,
          instance: a.instance,
          lastHeartbeatAt: a.lastHeartbeatAt ?? null,
          leaseUntil: a.leaseUntil > 0 ? a.leaseUntil : null,
          appliedRevision: a.appliedRevision,
          ackRevision: a.ackRevision,
          lapsed: this.#possiblyLapsed(a, now),
        }));
      const last = this.#lastReportAt[r];
      return { region, agents, lastReportAt: last ?? null, lagMs: last === undefined ? null : now - last };
    });
  }

  /** Forget an agent on an operator's word (it is gone for good). */
  forgetAgent(agentId: string): boolean {
    const agent = this.#agents.get(agentId);
    if (agent === undefined) return false;
    this.#forget(agentId);
    this.#settle(agent.region, this.#clock.now());
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
    return {
      policy,
      floor: shareFloor(policy.capacity, policy.maxCost, policy.minShare, this.settings),
      base,
      overrides: new Map(),
      reverting: new Set(),
      epoch: 0,
      seq: 0,
      unwrittenShrinks: [],
      demand: new DemandTracker(this.settings.demandHalfLifeMs),
      slowDemand: new DemandTracker(SUBJECT_SMOOTHING * this.settings.demandHalfLifeMs),
      subjects: new Map(),
      watch: [],
      watchedSince: new Map(),
      updatedAt: this.#clock.now(),
    };
  }

  #restore(record: AllocationRecord, revision: number): void {
    const unit = (u: UnitRecord): Unit => {
      const pending = this.regions.map((r) => u.pending[r]);
      return {
        shares: this.regions.map((r) => u.shares[r] ?? 0),
        pending,
        // The revision is not remembered; the record's own revision carries every pending shrink.
        pendingRevision: pending.some((p) => p !== undefined) ? revision : undefined,
        pendingSeq: 0,
        pendingSince: this.#clock.now(),
        target: undefined,
        moving: false,
        epoch: u.epoch,
      };
    };
    const policy = {
      name: record.policy,
      version: record.version,
      capacity: 1,
      refillPerSecond: 1,
      maxCost: 0,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: record.idleTtlSeconds,
    } satisfies Policy;
    // Placeholder until the policy store delivers the real policy (upsertPolicy); no step runs on a floor of 0
    // before then because the coordinator is in learning mode.
    const state = this.#newState(policy, unit(record.default));
    state.epoch = record.epoch;
    for (const [subject, u] of Object.entries(record.overrides)) state.overrides.set(subject, unit(u));
    for (const u of this.#units(state)) if (this.#inFlight(u)) this.#pendingUnits.set(u, state);
    for (let r = 0; r < this.regions.length; r++) {
      this.#shrinkHighWater[r] = Math.max(this.#shrinkHighWater[r]!, revision);
    }
    this.#policies.set(record.policy, state);
  }

  #units(state: PolicyState): Unit[] {
    return [state.base, ...state.overrides.values()];
  }

  #touch(state: PolicyState): void {
    state.seq++;
    state.epoch++;
    state.updatedAt = this.#clock.now();
    this.#dirty.add(state.policy.name);
  }

  #inFlight(unit: Unit): boolean {
    return unit.pending.some((p) => p !== undefined);
  }

  #agentLapsed(agent: Agent, now: number): boolean {
    return now > agent.leaseUntil + this.lease.skewMs;
  }

  /**
   * The agent may be deciding at its safe share: no renewal it reported holding is surely still in force (its
   * lease lapsed, it has not reported one of this incarnation's renewals since a restart or a partition, or it
   * is new and serving before its first renewal).
   */
  #possiblyLapsed(agent: Agent, now: number): boolean {
    return now > agent.surelyValidUntil;
  }

  /** Some agent of the region may be holding its safe share. */
  #lapsedIn(region: number, now: number): boolean {
    for (const a of this.#agents.values())
      if (a.region === region && this.#possiblyLapsed(a, now)) return true;
    return false;
  }

  #unwrittenShrinkIn(region: number): boolean {
    return this.#unwrittenShrinkCount[region]! > 0;
  }

  #noteUnwrittenShrink(state: PolicyState, regions: number[]): void {
    state.unwrittenShrinks.push({ seq: state.seq, regions });
    for (const r of regions) this.#unwrittenShrinkCount[r] = this.#unwrittenShrinkCount[r]! + 1;
  }

  /** Every agent of the region lapsed (and there is at least one): the region cannot be reached. */
  #unreachable(region: number, now: number): boolean {
    let any = false;
    for (const a of this.#agents.values()) {
      if (a.region !== region) continue;
      any = true;
      if (!this.#agentLapsed(a, now)) return false;
    }
    return any;
  }

  #claim(unit: Unit, r: number, lapsed: boolean): number {
    return Math.max(unit.shares[r]!, unit.pending[r] ?? 0, lapsed ? this.safe[r]! : 0);
  }

  /** The agent has not acknowledged a shrink of its region within the deadline. */
  #overdue(agent: Agent, now: number): boolean {
    const required = this.#requiredAcks[agent.region]!;
    // Entries every registered agent of the region has acknowledged are done with.
    while (required.length > 0 && this.#allAcked(agent.region, required[0]!.revision)) required.shift();
    for (const { revision, since } of required) {
      if (agent.ackRevision < revision && now - since > this.#ackTimeoutMs) return true;
    }
    return false;
  }

  #allAcked(region: number, revision: number): boolean {
    for (const a of this.#agents.values()) if (a.region === region && a.ackRevision < revision) return false;
    return true;
  }

  /** Clear the pending shrinks of `region` that every agent there acknowledged (or can no longer hold). */
  #settle(region: number, now: number): void {
    if (this.#pendingUnits.size === 0) return;
    for (const [unit, state] of [...this.#pendingUnits]) this.#settleUnit(state, unit, region, now);
  }

  #settleUnit(state: PolicyState, unit: Unit, region: number, now: number): void {
    if (unit.pending[region] === undefined || unit.pendingRevision === undefined) return;
    if (!this.#acknowledged(region, unit.pendingRevision, now)) return;
    unit.pending[region] = undefined;
    if (!this.#inFlight(unit)) {
      unit.pendingRevision = undefined;
      this.#pendingUnits.delete(unit);
      this.#grow(state, unit, now);
    }
  }

  #acknowledged(region: number, revision: number, now: number): boolean {
    for (const a of this.#agents.values()) {
      if (a.region === region && a.ackRevision < revision && !this.#agentLapsed(a, now)) return false;
    }
    return true;
  }

  /** Issue the grow half of a rebalance into the room the claims leave. */
  #grow(state: PolicyState, unit: Unit, now: number, knownLapsed?: readonly boolean[]): void {
    const target = unit.target;
    if (target === undefined || this.learning(now)) return;
    const lapsed = knownLapsed ?? this.regions.map((_, r) => this.#lapsedIn(r, now));
    let changed = false;
    let reached = true;
    for (let r = 0; r < target.length; r++) {
      const want = target[r]! - unit.shares[r]!;
      if (want <= EPSILON) continue;
      let claimed = 0;
      for (let i = 0; i < target.length; i++) claimed += this.#claim(unit, i, lapsed[i]!);
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
      this.counters.grows++;
      this.#touch(state);
    }
  }

  /** Move a unit toward `next`: shrinks now (pending until acknowledged), grows when they are. */
  #step(state: PolicyState, unit: Unit, next: number[], now: number, lapsed: readonly boolean[]): void {
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
      this.#recordShrink(state, unit, shrunk);
      this.counters.shrinks++;
      return;
    }
    this.#grow(state, unit, now, lapsed);
  }

  #recordShrink(state: PolicyState, unit: Unit, regions: number[]): void {
    unit.epoch++;
    this.#touch(state);
    unit.pendingRevision = undefined;
    unit.pendingSeq = state.seq;
    this.#pendingUnits.set(unit, state);
    this.#noteUnwrittenShrink(state, regions);
  }

  /**
   * A region whose every agent lapsed holds at most its safe share; shrink its issued share to that, so the rest
   * can go elsewhere and returning agents catch up (the shrink raises the region's minimum revision) first.
   */
  #releaseUnreachable(state: PolicyState, unit: Unit, unreachable: readonly boolean[]): void {
    const shrunk: number[] = [];
    for (let r = 0; r < this.regions.length; r++) {
      if (!unreachable[r] || unit.shares[r]! <= this.safe[r]! + EPSILON) continue;
      unit.shares[r] = this.safe[r]!;
      // Nobody there can acknowledge; the lapsed agents are covered by the safe share in the claim.
      unit.pending[r] = undefined;
      shrunk.push(r);
    }
    if (shrunk.length === 0) return;
    if (!this.#inFlight(unit)) {
      unit.pendingRevision = undefined;
      this.#pendingUnits.delete(unit);
    }
    unit.epoch++;
    this.#touch(state);
    this.#noteUnwrittenShrink(state, shrunk);
  }

  /**
   * When an agent lapsed, it may move to its safe share after the grace period: if the claims no longer fit,
   * shrink the regions above their safe share, in proportion, just enough (live agents acknowledge; lapsed ones
   * are covered by their safe share).
   */
  #restoreBudget(state: PolicyState, unit: Unit, lapsed: readonly boolean[]): void {
    // Pending shrinks are already on their way down: count what the claims settle at, so a cut is made once.
    let total = 0;
    for (let r = 0; r < this.regions.length; r++)
      total += Math.max(unit.shares[r]!, lapsed[r] ? this.safe[r]! : 0);
    const excess = total - 1;
    if (excess <= EPSILON) return;
    let above = 0;
    for (let r = 0; r < this.regions.length; r++) above += Math.max(0, unit.shares[r]! - this.safe[r]!);
    if (above <= EPSILON) return;
    const shrunk: number[] = [];
    for (let r = 0; r < this.regions.length; r++) {
      const spare = Math.max(0, unit.shares[r]! - this.safe[r]!);
      if (spare <= 0) continue;
      const cut = Math.min(spare, (excess * spare) / above + EPSILON);
      unit.pending[r] = Math.max(unit.pending[r] ?? 0, unit.shares[r]!);
      unit.shares[r] = unit.shares[r]! - cut;
      shrunk.push(r);
    }
    unit.target = undefined;
    this.#recordShrink(state, unit, shrunk);
    this.counters.safetyShrinks++;
  }

  #regionDemand(state: PolicyState, now: number): number[] {
    return state.demand.sumByTag(now, new Array<number>(this.regions.length).fill(0));
  }

  #observeSubject(
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
      const cap = Math.max(1, this.lease.maxOverridesPerPolicy * SUBJECTS_PER_OVERRIDE_SLOT);
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
        tracker: new DemandTracker(SUBJECT_SMOOTHING * this.settings.demandHalfLifeMs),
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
  #subjectIdeal(state: PolicyState, entry: SubjectDemand, now: number): number[] | undefined {
    return idealSharesWithin(
      entry.tracker.sumByTag(now, new Array<number>(this.regions.length).fill(0)),
      this.#knownIn(entry, now),
      state.base.shares,
      state.floor,
    );
  }

  /** How far a subject's ideal shares are from the policy's, both from demand smoothed alike. */
  #shapeGap(state: PolicyState, subjectIdeal: readonly number[], now: number): number {
    const policy = idealShares(
      state.slowDemand.sumByTag(now, new Array<number>(this.regions.length).fill(0)),
      state.floor,
    );
    return maxGap(subjectIdeal, policy ?? state.base.shares);
  }

  #knownIn(entry: SubjectDemand, now: number): boolean[] {
    const seen = entry.tracker.lastSeenByTag(new Array<number>(this.regions.length).fill(-Infinity));
    const recent = 2 * SUBJECT_SMOOTHING * this.settings.demandHalfLifeMs + 2 * this.lease.reportIntervalMs;
    return seen.map((at) => now - at <= recent);
  }

  /** Create overrides for constrained subjects, start reverting quiet ones, drop those back at the default. */
  #manageOverrides(state: PolicyState, now: number): void {
    for (const [subject, unit] of state.overrides) {
      const entry = state.subjects.get(subject);
      // Revert when the subject stopped being constrained, or its demand is shaped like the policy's again.
      const ideal = entry === undefined ? undefined : this.#subjectIdeal(state, entry, now);
      const quiet =
        entry === undefined ||
        now - entry.lastDeniedAt > this.lease.overrideTtlMs ||
        (ideal !== undefined && this.#shapeGap(state, ideal, now) < this.settings.hysteresis);
      if (quiet) state.reverting.add(subject);
      else state.reverting.delete(subject);
      if (
        state.reverting.has(subject) &&
        !this.#inFlight(unit) &&
        !this.#inFlight(state.base) &&
        unit.shares.every((s, r) => Math.abs(s - state.base.shares[r]!) <= EPSILON)
      ) {
        state.overrides.delete(subject);
        state.reverting.delete(subject);
        this.counters.overridesRemoved++;
        this.#touch(state);
      }
    }
    const candidates = [...state.subjects]
      .filter(([s, d]) => !state.overrides.has(s) && now - d.lastDeniedAt <= this.lease.overrideTtlMs)
      .sort((a, b) => b[1].deniedRate - a[1].deniedRate || (a[0] < b[0] ? -1 : 1));
    this.#updateWatch(state, candidates, now);
    const room = this.lease.maxOverridesPerPolicy - state.overrides.size;
    if (room <= 0) return;
    // A candidate gets an override only once every region has reported its demand (the watch list asks them to),
    // so the override follows where the subject's demand really is.
    const settled = 2 * this.settings.demandHalfLifeMs + 2 * this.lease.reportIntervalMs;
    let created = 0;
    for (const [subject, entry] of candidates) {
      if (created >= room) break;
      const since = state.watchedSince.get(subject);
      if (since === undefined || now - since < settled) continue;
      if (!this.#knownIn(entry, now).every(Boolean)) continue;
      // Only worth an override when the subject's demand is shaped unlike the policy's shares.
      // Only worth an override when the subject's demand is shaped clearly unlike the policy's shares: twice
      // the hysteresis, so the noise of one subject's few requests does not create and swing overrides.
      const ideal = this.#subjectIdeal(state, entry, now);
      if (ideal === undefined || this.#shapeGap(state, ideal, now) < 2 * this.settings.hysteresis) continue;
      const next = stepToward(state.base.shares, ideal, state.floor, this.settings);
      if (next === undefined) continue;
      // Start from the policy's state exactly (pending shrinks included): creating it moves nothing.
      const base = state.base;
      const copy: Unit = {
        shares: [...base.shares],
        pending: [...base.pending],
        pendingRevision: base.pendingRevision,
        pendingSeq: base.pendingSeq,
        pendingSince: base.pendingSince,
        target: undefined,
        moving: false,
        epoch: 0,
      };
      state.overrides.set(subject, copy);
      if (this.#inFlight(copy)) this.#pendingUnits.set(copy, state);
      created++;
      this.counters.overridesCreated++;
      this.#touch(state);
    }
  }

  /**
   * Watch the overrides and the most denied candidates (up to MAX_WATCHED_PER_POLICY): every agent reports their
   * demand each interval. The list changes only when its membership does.
   */
  #updateWatch(state: PolicyState, candidates: [string, SubjectDemand][], now: number): void {
    if (this.lease.maxOverridesPerPolicy === 0) return;
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
    this.#touch(state);
  }

  #forget(agentId: string): void {
    if (this.#agents.delete(agentId)) this.#registryWrites.push({ delete: agentId });
  }

  #forgetSilent(now: number): void {
    const after = this.lease.forgetAfterMs;
    if (after === undefined) return;
    for (const a of [...this.#agents.values()]) {
      const last = Math.max(a.leaseUntil, a.registeredAt);
      if (now - last > after) this.#forget(a.id);
    }
  }

  #byRegion(shares: readonly number[]): Record<string, number> {
    const out: Record<string, number> = {};
    for (let i = 0; i < this.regions.length; i++) out[this.regions[i]!] = shares[i]!;
    return out;
  }

  #unitRecord(unit: Unit): UnitRecord {
    const pending: Record<string, number> = {};
    unit.pending.forEach((p, r) => {
      if (p !== undefined) pending[this.regions[r]!] = p;
    });
    return { shares: this.#byRegion(unit.shares), pending, epoch: unit.epoch };
  }

  #record(state: PolicyState): AllocationRecord {
    return {
      policy: state.policy.name,
      version: state.policy.version,
      epoch: state.epoch,
      safe: this.#byRegion(this.safe),
      idleTtlSeconds: state.policy.idleTtlSeconds,
      default: this.#unitRecord(state.base),
      overrides: Object.fromEntries([...state.overrides].map(([s, u]) => [s, this.#unitRecord(u)])),
      ...(state.watch.length > 0 ? { watch: [...state.watch] } : {}),
      updatedAt: state.updatedAt,
    };
  }
}
