/**
 * The conservation protocol of core/ inside a run: one LeaseCoordinator on the coordinator node, one AgentLease
 * per agent (`agentsPerRegion` per region), and the JetStream KV they share, all talking over the simulated
 * network as `control` messages, so delay, jitter, loss, partitions and coordinator crashes apply to every one
 * of them and each counts in `controlMessagesPerSecond`.
 *
 * Messages, as the NATS shells exchange them (core/wire/protocol.ts):
 * - every report interval each agent sends its usage and a heartbeat to the coordinator; the reply (a renewal or
 *   a refusal) comes back over the same link, a renewal to an agent not yet registered only once its registration
 *   is written to the agents bucket and confirmed (core/lease: `awaitsRegistration`);
 * - the coordinator's record writes go to the KV (a local hop: NATS sits with the coordinator in the home
 *   region), which confirms each with its revision (`written`) and delivers it to every agent's watch;
 * - an agent acknowledges a record carrying a shrink of its region when no decision of an older one is in flight;
 * - a watch that fell behind (a renewal whose minimum revision it has not applied, or the KV's idle heartbeat
 *   naming a newer revision) asks the KV for what it missed, as an ordered consumer resets.
 *
 * At virtual time 0 the deployment has just become ready: the coordinator wrote the policy's allocation (the
 * safe shares) and every agent read it and holds its first lease. The coordinator is in learning mode, as after
 * any start (until every agent reports holding its renewal, and three report intervals after the first
 * heartbeat). A crash drops the engine (its memory); the restart builds a new one from the KV's records and agent
 * registry, in learning mode.
 */
import type { DemandSnapshot } from '../../core/lease/demand-snapshot.js';
import { zeroCounters, type EngineCounters } from '../../core/lease/engine-counters.js';
import { LeaseCoordinator } from '../../core/lease/lease-coordinator.js';
import type { LeaseSettings } from '../../core/lease/settings.js';
import type { Policy } from '../../core/policy/policy.js';
import type { RebalanceSettings } from '../../core/rebalance/settings.js';
import type { AgentRegistration, AllocationRecord, RenewalReply } from '../../core/wire/protocol.js';
import type { Fault } from '../scenario.js';
import type { Outcome, PENDING, SimRequest, StrategyContext } from '../strategy.js';
import { SimBorrowing, type SimBorrowingOptions } from './sim-borrowing.js';
import { SimAgent } from './agent-node.js';
import { InForceTracker } from './in-force.js';
import { SimKv } from './sim-kv.js';
import { VirtualClock } from './virtual-clock.js';

/** How often the KV tells a watcher its latest revision (a JetStream consumer's idle heartbeat), ms. */
export const WATCH_HEARTBEAT_MS = 5000;

export interface ControlPlaneOptions {
  lease: LeaseSettings;
  rebalance: RebalanceSettings;
  agentsPerRegion: number;
  /**
   * A standby coordinator takes over this long after the leader crashes (its leader lease, coordinator/leadership),
   * from the replicated KV, in learning mode like any start; the crashed one then stays a standby. 0 or absent:
   * no standby, the crashed coordinator leads again when it returns.
   */
  standbyAfterMs?: number;
  /** Borrow a short subject's tokens from other regions (sim-borrowing.ts); undefined: never. */
  borrowing?: SimBorrowingOptions | undefined;
}

/** A message of the protocol, as the simulator sees it in flight (for tests that check the wire). */
export type ProtocolMessage =
  | { kind: 'heartbeat' | 'usage' | 'ack' | 'renewal'; body: unknown }
  | { kind: 'record'; body: AllocationRecord | null }
  | { kind: 'snapshot'; body: DemandSnapshot | null };

export class DynamicControlPlane {
  readonly records = new SimKv<AllocationRecord>();
  readonly registry = new SimKv<AgentRegistration>();
  /** The leader's demand snapshots (`<ns>-demand`), which a coordinator that takes over starts from. */
  readonly demand = new SimKv<DemandSnapshot>();
  readonly agents: SimAgent[] = [];
  readonly #ctx: StrategyContext;
  readonly #options: ControlPlaneOptions;
  readonly #policy: Policy;
  readonly #clock: VirtualClock;
  readonly #tracker: InForceTracker;
  readonly #byRegion: SimAgent[][];
  readonly #turn: number[];
  readonly #kvNode: number;
  readonly #endUs: number;
  readonly #borrowing: SimBorrowing | undefined;
  #engine: LeaseCoordinator | undefined;
  #incarnation = 0;
  /** Renewals waiting for their agent's registration to be written, by agent id (the incarnation's). */
  readonly #heldRenewals = new Map<string, (() => void)[]>();
  readonly #counters: EngineCounters = zeroCounters();
  /** Sees every protocol message at the instant it is sent (tests). */
  onMessage: ((message: ProtocolMessage) => void) | undefined;

  constructor(ctx: StrategyContext, options: ControlPlaneOptions) {
    this.#ctx = ctx;
    this.#options = options;
    this.#policy = ctx.policy;
    this.#clock = new VirtualClock(() => ctx.now());
    this.#kvNode = ctx.home;
    this.#endUs = ctx.settings.durationS * 1e6;
    this.#tracker = new InForceTracker(ctx.regions.length, (unit, shares) => ctx.sharesInForce(unit, shares));
    this.#byRegion = ctx.regions.map(() => []);
    this.#turn = ctx.regions.map(() => 0);
    this.#borrowing =
      options.borrowing === undefined
        ? undefined
        : new SimBorrowing(ctx, this.#clock, this.#byRegion, options.borrowing);
  }

  /** The coordinator engine of the current incarnation; undefined while it is down. */
  get engine(): LeaseCoordinator | undefined {
    return this.#engine;
  }

  /** Bring the deployment up at virtual time 0 (see the module comment). */
  start(): void {
    const ctx = this.#ctx;
    this.#startEngine();
    this.#flush(true);
    ctx.regions.forEach((regionName, region) => {
      for (let ordinal = 0; ordinal < this.#options.agentsPerRegion; ordinal++) {
        const intervalMs = this.#options.lease.reportIntervalMs;
        const firstBeat = this.#offset(intervalMs);
        const agent = new SimAgent({
          ordinal,
          region,
          regionName,
          policy: this.#policy,
          clock: this.#clock,
          skewMs: this.#options.lease.skewMs,
          graceMs: this.#options.lease.graceMs,
          reportIntervalMs: intervalMs,
          previousReportAt: this.#clock.now() + (firstBeat - ctx.now()) / 1000 - intervalMs,
          logShare: ctx.settings.logShare,
        });
        this.agents.push(agent);
        this.#byRegion[region]!.push(agent);
        const handle = this.#tracker.add(region);
        agent.lease.onInForce((c) => this.#tracker.set(handle, c.subject, c.share, c.removed === true));
        agent.lease.onAck((ackRevision) => this.#ack(agent, ackRevision));
        for (const { key, value, revision } of this.records.live())
          agent.lease.applyRecord(key, value, revision);
        agent.lease.recordsLoaded();
        // Its first lease, granted before the run begins.
        const sentAt = this.#clock.now();
        const first = agent.heartbeat();
        const reply = this.#engine!.heartbeat(first);
        // Its registration is written (and confirmed) at once, before the renewal is taken.
        this.#flush(true);
        this.#renewal(agent, reply, sentAt, first.seq);
        ctx.at(firstBeat, () => this.#beat(agent));
        ctx.at(this.#offset(WATCH_HEARTBEAT_MS), () => this.#watchHeartbeat(agent));
      }
    });
  }

  /**
   * Decide on one of the region's agents, in turn; with borrowing, a request its region's bucket is short for
   * waits for a borrow (PENDING) and completes later.
   */
  decide(request: SimRequest): Outcome | typeof PENDING {
    const agents = this.#byRegion[request.region]!;
    const turn = this.#turn[request.region]!;
    this.#turn[request.region] = turn + 1;
    const agent = agents[turn % agents.length]!;
    const store = this.#ctx.stores[request.region]!;
    if (this.#borrowing === undefined) return agent.decide(request, store);
    const evaluation = agent.evaluate(request, store, request.at);
    if (evaluation.short) return this.#borrowing.cover(agent, request, evaluation);
    agent.record(request, evaluation.outcome.allowed, evaluation.remainingFraction);
    if (evaluation.outcome.allowed) this.#borrowing.topUp(agent, request.subject, evaluation);
    return evaluation.outcome;
  }

  /** The policy's default vector in force at the agents, by region. */
  shares(): number[] {
    return this.#tracker.policyShares();
  }

  onFault(fault: Fault): void {
    if (fault.kind === 'coordinator-down') {
      this.#crash();
      const after = this.#options.standbyAfterMs ?? 0;
      if (after > 0) {
        const incarnation = this.#incarnation;
        this.#ctx.at(this.#ctx.now() + after * 1000, () => {
          // Only if nothing leads yet: the standby takes the lease once the crashed leader's has run out.
          if (this.#engine !== undefined || this.#incarnation !== incarnation) return;
          this.#ctx.count('standbyTakeovers');
          // The standby runs at the coordinator's node (the simulator keeps one coordinator node): it answers there
          // from now on, while the crashed process stays down.
          this.#ctx.network.setDown(this.#ctx.coordinator, false);
          this.#startEngine();
          this.#flush(false);
        });
      }
    } else if (fault.kind === 'coordinator-up') {
      // With a standby leading, the returning coordinator waits as the standby (it finds the lease held).
      if (this.#engine !== undefined) return;
      this.#startEngine();
      this.#flush(false);
    }
  }

  /** Add the engines' counters and the control plane's to the run's counters. */
  finish(): void {
    this.#borrowing?.finish();
    if (this.#engine !== undefined) this.#addCounters(this.#engine.counters);
    for (const name of Object.keys(this.#counters) as (keyof EngineCounters)[]) {
      const value = this.#counters[name];
      if (value > 0) this.#ctx.count(`coordinator:${name}`, value);
    }
  }

  // ---- coordinator ------------------------------------------------------------------------------------------

  #startEngine(): void {
    const incarnation = ++this.#incarnation;
    this.#ctx.count('coordinatorStarts');
    this.#engine = new LeaseCoordinator({
      coordinatorId: `coordinator-${incarnation}`,
      regions: this.#ctx.regions,
      clock: this.#clock,
      rebalance: this.#options.rebalance,
      lease: this.#options.lease,
      records: this.records.live().map(({ value, revision }) => ({ record: value, revision })),
      agents: this.registry.live().map(({ value }) => value),
      demandSnapshots: this.demand.live().map(({ value }) => value),
    });
    for (const [outcome, n] of this.#engine.snapshotOutcomes)
      this.#ctx.count(`demandSnapshots:${outcome}`, n);
    this.#engine.upsertPolicy(this.#policy);
    const round = () => {
      if (this.#incarnation !== incarnation || this.#ctx.now() >= this.#endUs) return;
      this.#engine!.tick();
      this.#flush(false);
      this.#snapshots();
      this.#ctx.at(this.#ctx.now() + this.#options.rebalance.roundMs * 1000, round);
    };
    this.#ctx.at(this.#ctx.now() + this.#options.rebalance.roundMs * 1000, round);
  }

  /** The leader's demand snapshots due this round, each a put over its local link to NATS, like a record. */
  #snapshots(): void {
    const engine = this.#engine;
    if (engine === undefined) return;
    for (const write of engine.takeDemandSnapshots()) {
      this.onMessage?.({ kind: 'snapshot', body: write.snapshot });
      this.#ctx.network.send(this.#ctx.coordinator, this.#kvNode, 'control', () =>
        this.demand.put(write.policy, write.snapshot),
      );
    }
  }

  #crash(): void {
    if (this.#engine !== undefined) this.#addCounters(this.#engine.counters);
    this.#engine = undefined;
    // Its timers, the replies to its writes and the renewals it held belong to the dead incarnation.
    this.#incarnation++;
    this.#heldRenewals.clear();
  }

  #addCounters(counters: EngineCounters): void {
    for (const name of Object.keys(counters) as (keyof EngineCounters)[])
      this.#counters[name] += counters[name];
  }

  /**
   * Persist what the engine asks to: each record goes to the KV, which answers with its revision and delivers it
   * to every watch; registry changes go to the agents bucket. `now` applies them at once (the start-up, before
   * the run), otherwise over the coordinator's local link to NATS.
   */
  #flush(now: boolean): void {
    const engine = this.#engine;
    if (engine === undefined) return;
    const incarnation = this.#incarnation;
    const net = this.#ctx.network;
    const coordinator = this.#ctx.coordinator;
    for (const write of engine.takeWrites()) {
      this.#ctx.count('recordWrites');
      const put = () => {
        const revision = this.records.put(write.policy, write.record);
        if (!now) for (const agent of this.agents) this.#deliver(agent, write.policy, write.record, revision);
        const confirm = () => {
          if (this.#incarnation !== incarnation) return;
          engine.written(write.policy, write.seq, revision);
          this.#flush(now);
        };
        if (now) confirm();
        else net.send(this.#kvNode, coordinator, 'control', confirm);
      };
      if (now) put();
      else net.send(coordinator, this.#kvNode, 'control', put);
    }
    for (const change of engine.takeRegistryWrites()) {
      // A registration is confirmed back, and only then are the renewals held for its agent sent.
      const confirm = (agentId: string) => {
        if (this.#incarnation !== incarnation) return;
        engine.registered(agentId);
        const held = this.#heldRenewals.get(agentId) ?? [];
        this.#heldRenewals.delete(agentId);
        for (const send of held) send();
      };
      const apply = () => {
        if ('put' in change) {
          const agentId = change.put.agentId;
          this.registry.put(agentId, change.put);
          if (now) confirm(agentId);
          else net.send(this.#kvNode, coordinator, 'control', () => confirm(agentId));
        } else this.registry.put(change.delete, null);
      };
      if (now) apply();
      else net.send(coordinator, this.#kvNode, 'control', apply);
    }
  }

  // ---- agents -----------------------------------------------------------------------------------------------

  /** One report interval of an agent: usage, then a heartbeat whose reply renews its lease. */
  #beat(agent: SimAgent): void {
    const ctx = this.#ctx;
    if (ctx.now() >= this.#endUs) return;
    const sentAt = this.#clock.now();
    const usage = agent.usage();
    const heartbeat = agent.heartbeat();
    this.onMessage?.({ kind: 'usage', body: usage });
    ctx.network.send(agent.region, ctx.coordinator, 'control', () => {
      this.#engine?.usage(usage);
    });
    this.onMessage?.({ kind: 'heartbeat', body: heartbeat });
    ctx.network.send(agent.region, ctx.coordinator, 'control', () => {
      const engine = this.#engine;
      if (engine === undefined) return;
      const reply = engine.heartbeat(heartbeat);
      const send = () => {
        this.onMessage?.({ kind: 'renewal', body: reply });
        ctx.network.send(ctx.coordinator, agent.region, 'control', () =>
          this.#renewal(agent, reply, sentAt, heartbeat.seq),
        );
      };
      // A renewal is sent only once its agent's registration is written (core/lease: awaitsRegistration).
      const held = !('refused' in reply) && engine.awaitsRegistration(agent.id);
      if (held) this.#heldRenewals.set(agent.id, [...(this.#heldRenewals.get(agent.id) ?? []), send]);
      this.#flush(false);
      if (!held) send();
    });
    ctx.at(ctx.now() + agent.reportIntervalMs * 1000, () => this.#beat(agent));
  }

  #renewal(agent: SimAgent, reply: RenewalReply, sentAt: number, seq: number): void {
    if ('refused' in reply) {
      agent.lease.refused(reply.refused);
      this.#ctx.count('renewalsRefused');
      return;
    }
    agent.lease.renewed(reply, sentAt, seq);
    agent.reportIntervalMs = reply.reportIntervalMs;
    agent.graceMs = reply.graceMs;
    // A renewal waiting for a shrink this agent has not seen: its watch fell behind, catch up.
    if (agent.lease.appliedRevision < reply.minRevision) this.#resync(agent);
    this.#armExpiry(agent);
  }

  #ack(agent: SimAgent, ackRevision: number): void {
    const ctx = this.#ctx;
    const ack = { agentId: agent.id, region: agent.regionName, ackRevision };
    this.onMessage?.({ kind: 'ack', body: ack });
    ctx.network.send(agent.region, ctx.coordinator, 'control', () => {
      const engine = this.#engine;
      if (engine === undefined) return;
      engine.ack(ack);
      this.#flush(false);
    });
  }

  /** A KV entry on its way to an agent's watch. */
  #deliver(agent: SimAgent, policy: string, record: AllocationRecord | null, revision: number): void {
    this.onMessage?.({ kind: 'record', body: record });
    this.#ctx.network.send(this.#kvNode, agent.region, 'control', () => {
      agent.lease.applyRecord(policy, record, revision);
      this.#armExpiry(agent);
    });
  }

  /** The watch asks the KV for every entry after the revision it applied (request, then one reply per entry). */
  #resync(agent: SimAgent): void {
    const ctx = this.#ctx;
    ctx.count('watchResyncs');
    const after = agent.lease.appliedRevision;
    ctx.network.send(agent.region, this.#kvNode, 'control', () => {
      for (const { key, value, revision } of this.records.since(after))
        this.#deliver(agent, key, value, revision);
    });
  }

  /** The KV's idle heartbeat to one watch: its latest revision, so a watch that missed the last entry notices. */
  #watchHeartbeat(agent: SimAgent): void {
    const ctx = this.#ctx;
    if (ctx.now() >= this.#endUs) return;
    const latest = this.records.revision;
    ctx.network.send(this.#kvNode, agent.region, 'control', () => {
      if (agent.lease.appliedRevision < latest) this.#resync(agent);
    });
    ctx.at(ctx.now() + WATCH_HEARTBEAT_MS * 1000, () => this.#watchHeartbeat(agent));
  }

  /**
   * Look at the lease again the instant it expires and the instant its grace ends, so the shares in force are
   * reported when they change, not at the next message.
   */
  #armExpiry(agent: SimAgent): void {
    const until = agent.lease.leaseUntil;
    if (until <= agent.armedUntil) return;
    agent.armedUntil = until;
    for (const at of [until, until + agent.graceMs]) {
      // A renewal that arrived late can end a lease already over: look at once then.
      this.#ctx.at(Math.max(this.#ctx.now(), this.#clock.toVirtualUs(at) + 1), () => agent.lease.poll());
    }
  }

  /** A first timer in (0, interval], drawn per agent, so agents do not report in lockstep. */
  #offset(intervalMs: number): number {
    return this.#ctx.now() + 1 + this.#ctx.random.int(Math.max(1, Math.round(intervalMs * 1000)));
  }
}
