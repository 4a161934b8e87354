/**
 * The conservation protocol on a virtual clock: one LeaseCoordinator and several AgentLeases wired by an
 * in-memory bus and KV with per-message delay, partitions and crashes. Lets unit tests drive hours of rounds in
 * milliseconds and check the invariant at every instant.
 */
import { ManualClock } from '../../core/clock.js';
import { AgentLease } from '../../core/lease/agent-lease.js';
import type { DemandSnapshot } from '../../core/lease/demand-snapshot.js';
import { LeaseCoordinator, type LeaseCoordinatorOptions } from '../../core/lease/lease-coordinator.js';
import type { LeaseSettingsInput } from '../../core/lease/settings.js';
import type { Policy } from '../../core/policy/policy.js';
import type { RebalanceSettingsInput } from '../../core/rebalance/settings.js';
import type { AgentRegistration, AllocationRecord, PolicyUsage } from '../../core/wire/protocol.js';
import { ConservationChecker } from '../harness/conservation-checker.js';

interface Event {
  at: number;
  seq: number;
  run: () => void;
}

export interface LoopAgent {
  id: string;
  region: string;
  lease: AgentLease;
  /** Requested cost per second, per policy (what its usage reports say). */
  demand: Map<string, number>;
  /** Constrained subjects it reports, per policy: requested and denied cost per second. */
  constrained: Map<string, { subject: string; requested: number; denied: number }[]>;
  /** Policies whose constrained list it reports as cut to the bound (more subjects were constrained). */
  truncated: Set<string>;
  /** `policy\0subject` pairs its constrained list leaves out (cut by the bound), though they have demand here. */
  omitted: Set<string>;
  /** Cut off from the coordinator and the KV (messages to and from it are lost). */
  partitioned: boolean;
  /**
   * Its connection is down but its client buffers what it sends (as a NATS client does while reconnecting):
   * messages to the coordinator wait here, nothing reaches the agent. `release` drains them, oldest first.
   */
  held: (() => void)[] | undefined;
  /** Its KV watch is stuck: records queue up undelivered while heartbeats still flow. */
  stalled: boolean;
  stalledRecords: (() => void)[];
  alive: boolean;
  heartbeats: number;
}

export interface LoopOptions {
  regions: string[];
  agentsPerRegion: number;
  delayMs?: number;
  rebalance?: RebalanceSettingsInput;
  lease?: LeaseSettingsInput;
  /** Relative noise on reported demand, e.g. 0.3 for ±30% (seeded). */
  noise?: number;
  seed?: number;
}

export class ProtocolLoop {
  readonly clock = new ManualClock(1_750_000_000_000);
  readonly checker = new ConservationChecker();
  readonly agents: LoopAgent[] = [];
  engine: LeaseCoordinator | undefined;
  readonly kv = new Map<string, { record: AllocationRecord; revision: number }>();
  readonly registry = new Map<string, AgentRegistration>();
  /** The demand snapshots the coordinator persisted, by policy (its KV bucket `<ns>-demand`). */
  readonly demandSnapshots = new Map<string, DemandSnapshot>();
  revision = 0;
  messages = 0;
  /**
   * JetStream refuses writes (a stream leader election, lost quorum): every allocation record write fails and is
   * handed back (`writeFailed`), to be retried at the next flush, while core NATS (heartbeats, usage, acks,
   * replies) still flows. Registry and demand snapshot writes are not affected.
   */
  writesFailing = false;
  readonly #queue: Event[] = [];
  #seq = 0;
  #agentSeq = 0;
  #rng: number;
  readonly #options: Required<Omit<LoopOptions, 'rebalance' | 'lease'>> &
    Pick<LoopOptions, 'rebalance' | 'lease'>;
  readonly #policies = new Map<string, Policy>();
  #coordinatorSeq = 0;

  constructor(options: LoopOptions) {
    this.#options = { delayMs: 2, noise: 0, seed: 1, ...options };
    this.#rng = this.#options.seed;
    this.startCoordinator();
    for (const region of options.regions) {
      for (let i = 0; i < options.agentsPerRegion; i++) this.startAgent(region);
    }
    // Lease expiry happens with time alone: look every 50 ms so the checker sees it when it happens.
    const poll = () => {
      for (const a of this.agents) if (a.alive) a.lease.poll();
      this.at(50, poll);
    };
    this.at(50, poll);
  }

  get roundMs(): number {
    return this.engine?.settings.roundMs ?? 1000;
  }

  // ---- time -------------------------------------------------------------------------------------------------

  at(delay: number, run: () => void): void {
    this.#queue.push({ at: this.clock.now() + delay, seq: this.#seq++, run });
  }

  /** Run events until `ms` of virtual time have passed. */
  advance(ms: number): void {
    const end = this.clock.now() + ms;
    for (;;) {
      let next = -1;
      for (let i = 0; i < this.#queue.length; i++) {
        const e = this.#queue[i]!;
        if (e.at > end) continue;
        if (
          next === -1 ||
          e.at < this.#queue[next]!.at ||
          (e.at === this.#queue[next]!.at && e.seq < this.#queue[next]!.seq)
        )
          next = i;
      }
      if (next === -1) break;
      const [event] = this.#queue.splice(next, 1);
      this.clock.set(Math.max(this.clock.now(), event!.at));
      event!.run();
    }
    this.clock.set(end);
    for (const a of this.agents) if (a.alive) a.lease.poll();
  }

  // ---- coordinator --------------------------------------------------------------------------------------------

  startCoordinator(extra: Partial<LeaseCoordinatorOptions> = {}): void {
    const incarnation = ++this.#coordinatorSeq;
    this.engine = new LeaseCoordinator({
      coordinatorId: `c${incarnation}`,
      regions: this.#options.regions,
      clock: this.clock,
      // The protocol's mechanics, made quick to exercise: moves after 2 s beyond the band (the default waits a
      // minute for a split of demand that lasts) and per-subject overrides on (off by default).
      rebalance: { confirmMs: 2000, ...this.#options.rebalance },
      lease: { maxOverridesPerPolicy: 16, ...this.#options.lease },
      records: [...this.kv.values()],
      agents: [...this.registry.values()],
      // A successor seeds demand and move state from what its predecessor persisted, as the real one does.
      demandSnapshots: [...this.demandSnapshots.values()],
      ...extra,
    });
    for (const p of this.#policies.values()) this.engine.upsertPolicy(p);
    this.#flush();
    const round = () => {
      if (this.engine === undefined || this.#coordinatorSeq !== incarnation) return;
      this.engine.tick();
      this.#flush();
      this.at(this.roundMs, round);
    };
    this.at(this.roundMs, round);
  }

  /** The coordinator dies: its memory is gone, the KV stays. */
  killCoordinator(): void {
    this.engine = undefined;
    this.#coordinatorSeq++;
  }

  upsertPolicy(policy: Policy): void {
    this.#policies.set(policy.name, policy);
    this.engine?.upsertPolicy(policy);
    this.#flush();
  }

  #flush(): void {
    const engine = this.engine;
    if (engine === undefined) return;
    for (const write of engine.takeWrites()) {
      if (this.writesFailing) {
        engine.writeFailed(write.policy);
        continue;
      }
      const revision = ++this.revision;
      if (write.record === null) this.kv.delete(write.policy);
      else this.kv.set(write.policy, { record: write.record, revision });
      engine.written(write.policy, write.seq, revision);
      for (const agent of this.agents) {
        const apply = () => agent.lease.applyRecord(write.policy, write.record, revision);
        this.#deliver(agent, () => (agent.stalled ? agent.stalledRecords.push(apply) : apply()));
      }
    }
    for (const change of engine.takeRegistryWrites()) {
      // Written at once: the renewal a registration holds back (awaitsRegistration) goes out after this flush.
      if ('put' in change) {
        this.registry.set(change.put.agentId, change.put);
        engine.registered(change.put.agentId);
      } else this.registry.delete(change.delete);
    }
    for (const write of engine.takeDemandSnapshots()) {
      if (write.snapshot === null) this.demandSnapshots.delete(write.policy);
      else this.demandSnapshots.set(write.policy, write.snapshot);
    }
  }

  // ---- agents ---------------------------------------------------------------------------------------------------

  startAgent(region: string): LoopAgent {
    const id = `agent-${region}-${++this.#agentSeq}`;
    const lease = new AgentLease({ region, clock: this.clock, skewMs: 1000, startupWaitMs: 3000 });
    const agent: LoopAgent = {
      id,
      region,
      lease,
      demand: new Map(),
      constrained: new Map(),
      truncated: new Set(),
      omitted: new Set(),
      partitioned: false,
      held: undefined,
      stalled: false,
      stalledRecords: [],
      alive: true,
      heartbeats: 0,
    };
    this.agents.push(agent);
    // A new agent reads the KV first (the persisted leases), then starts its heartbeats.
    for (const [policy, { record, revision }] of [...this.kv].sort((a, b) => a[1].revision - b[1].revision)) {
      lease.applyRecord(policy, record, revision);
    }
    lease.recordsLoaded();
    this.checker.watch(id, region, lease);
    lease.onAck((ackRevision) =>
      this.#toCoordinator(agent, (engine) => engine.ack({ agentId: id, region, ackRevision })),
    );
    const interval = this.engine?.lease.reportIntervalMs ?? 1000;
    const beat = () => {
      if (!agent.alive) return;
      this.#heartbeat(agent, interval);
      this.at(interval, beat);
    };
    this.at(1 + (this.#agentSeq % 7) * 3, beat);
    return agent;
  }

  /** Stop an agent; `graceful` sends a goodbye. */
  stopAgent(agent: LoopAgent, graceful: boolean): void {
    agent.alive = false;
    this.checker.unwatch(agent.id);
    if (graceful)
      this.#toCoordinator(agent, (engine) => engine.bye({ agentId: agent.id, region: agent.region }), true);
  }

  /** End an agent's partition: its KV watch catches up, its heartbeats get through again. */
  heal(agent: LoopAgent): void {
    agent.partitioned = false;
    for (const [policy, { record, revision }] of [...this.kv].sort((a, b) => a[1].revision - b[1].revision)) {
      if (revision > agent.lease.appliedRevision)
        this.#deliver(agent, () => agent.lease.applyRecord(policy, record, revision));
    }
  }

  /** Cut an agent off while its client buffers what it sends (see `LoopAgent.held`). */
  hold(agent: LoopAgent): void {
    agent.partitioned = true;
    agent.held = [];
  }

  /**
   * The connection is back: the agent catches up on the KV and its buffered messages reach the coordinator one
   * every `spacingMs`, oldest first, with rounds running in between (a slow drain). Use a spacing below the
   * report interval, or the backlog never drains.
   */
  release(agent: LoopAgent, spacingMs: number): void {
    this.heal(agent);
    // What the agent sends meanwhile queues behind the backlog, as it would in the client's buffer.
    const drain = () => {
      const held = agent.held;
      if (held === undefined) return;
      const next = held.shift();
      if (next === undefined) {
        agent.held = undefined;
        return;
      }
      next();
      this.at(spacingMs, drain);
    };
    drain();
  }

  /** Unstick an agent's KV watch: the queued records arrive. */
  unstall(agent: LoopAgent): void {
    agent.stalled = false;
    for (const apply of agent.stalledRecords.splice(0)) apply();
  }

  /** Issued default shares of a policy, by region (from the KV, as agents see them). */
  shares(policy: string): Record<string, number> {
    return this.kv.get(policy)?.record.default.shares ?? {};
  }

  /** Every agent of `region` reports `subject` of `policy` as constrained (per-second rates), or stops (null). */
  setConstrained(
    region: string,
    policy: string,
    subject: string,
    rates: { requested: number; denied: number } | null,
  ): void {
    for (const a of this.agents.filter((x) => x.region === region && x.alive)) {
      const list = (a.constrained.get(policy) ?? []).filter((c) => c.subject !== subject);
      if (rates !== null) list.push({ subject, ...rates });
      a.constrained.set(policy, list);
    }
  }

  /** Every agent of `region` leaves `subject` out of its constrained list of `policy` (or puts it back). */
  setOmitted(region: string, policy: string, subject: string, omitted: boolean): void {
    for (const a of this.agents.filter((x) => x.region === region && x.alive)) {
      if (omitted) a.omitted.add(`${policy}\u0000${subject}`);
      else a.omitted.delete(`${policy}\u0000${subject}`);
    }
  }

  /** Every agent of `region` reports its constrained list of `policy` as cut to the bound, or complete. */
  setTruncated(region: string, policy: string, truncated: boolean): void {
    for (const a of this.agents.filter((x) => x.region === region && x.alive)) {
      if (truncated) a.truncated.add(policy);
      else a.truncated.delete(policy);
    }
  }

  setDemand(region: string, policy: string, perSecond: number): void {
    const agents = this.agents.filter((a) => a.region === region && a.alive);
    for (const a of agents) a.demand.set(policy, perSecond / agents.length);
  }

  /** Demand of `policy` summed over every live agent, cost per second. */
  #totalDemand(policy: string): number {
    let total = 0;
    for (const a of this.agents) if (a.alive) total += a.demand.get(policy) ?? 0;
    return total;
  }

  #heartbeat(agent: LoopAgent, intervalMs: number): void {
    const sentAt = this.clock.now();
    agent.heartbeats++;
    const hb = {
      agentId: agent.id,
      instance: agent.id,
      region: agent.region,
      seq: agent.heartbeats,
      appliedRevision: agent.lease.appliedRevision,
      ackRevision: agent.lease.ackRevision,
      mode: agent.lease.mode(),
      renewedSeq: agent.lease.renewedSeq,
    };
    const policies: PolicyUsage[] = [...agent.demand].map(([policy, rate]) => {
      const requested = rate * (intervalMs / 1000) * (1 + this.#noise());
      const seconds = intervalMs / 1000;
      const subjects = agent.constrained.get(policy) ?? [];
      const constrained = subjects
        .filter((c) => c.denied > 0 && !agent.omitted.has(`${policy}\u0000${c.subject}`))
        .map((c) => ({ subject: c.subject, requested: c.requested * seconds, denied: c.denied * seconds }));
      // Watched subjects are reported with their demand here, zero included, as the agent's recorder does.
      const watched = [...agent.lease.watched(policy)].map((subject) => {
        const c = subjects.find((x) => x.subject === subject);
        return { subject, requested: (c?.requested ?? 0) * seconds, denied: (c?.denied ?? 0) * seconds };
      });
      // The policy's budget is taken to be exactly its total demand (saturated): a region asking more than its
      // share of that is refused the rest, which the coordinator sees as unmet demand (room needed).
      const share = agent.lease.shareFor(policy, '')?.share ?? 0;
      const peers = this.agents.filter((a) => a.alive && a.region === agent.region).length;
      const admitted = Math.min(
        requested,
        (share * this.#totalDemand(policy) * seconds) / Math.max(1, peers),
      );
      return {
        policy,
        requested,
        admitted,
        denied: requested - admitted,
        constrained,
        ...(agent.truncated.has(policy) ? { truncated: true } : {}),
        ...(watched.length > 0 ? { watched } : {}),
      };
    });
    this.#toCoordinator(agent, (engine) => {
      engine.usage({
        agentId: agent.id,
        region: agent.region,
        seq: agent.heartbeats,
        intervalMs,
        chunk: 0,
        chunks: 1,
        policies,
        dropped: 0,
      });
      const reply = engine.heartbeat(hb);
      this.#flush();
      if (!('refused' in reply) && engine.awaitsRegistration(agent.id))
        throw new Error(`a renewal to ${agent.id} would go out before its registration is written`);
      this.#deliver(agent, () => {
        if ('refused' in reply) agent.lease.refused(reply.refused);
        else agent.lease.renewed(reply, sentAt, hb.seq);
      });
    });
  }

  #toCoordinator(agent: LoopAgent, run: (engine: LeaseCoordinator) => void, evenIfDead = false): void {
    if (!agent.alive && !evenIfDead) return;
    const send = () => {
      this.messages++;
      this.at(this.#options.delayMs, () => {
        if (this.engine === undefined) return;
        run(this.engine);
        this.#flush();
      });
    };
    if (agent.held !== undefined) agent.held.push(send);
    else if (!agent.partitioned) send();
  }

  #deliver(agent: LoopAgent, run: () => void): void {
    if (agent.partitioned || !agent.alive) return;
    this.messages++;
    this.at(this.#options.delayMs, () => {
      if (agent.alive && !agent.partitioned) run();
    });
  }

  #noise(): number {
    if (this.#options.noise === 0) return 0;
    // xorshift32: deterministic noise in [-noise, +noise].
    let x = this.#rng;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#rng = x >>> 0;
    return ((this.#rng / 0xffffffff) * 2 - 1) * this.#options.noise;
  }
}
