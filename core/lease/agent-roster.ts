/**
 * The agents the lease coordinator knows, by region: who registered, which renewal each says it holds, what it
 * has applied and acknowledged, and from that whether it may be deciding at its safe share (lapsed). The lease
 * coordinator asks it; it changes nothing of the allocations. Registrations it adds or forgets are handed to the
 * shell to persist (`takeWrites`); a new agent is `registered` once the shell confirms the write, and no renewal
 * goes to it before.
 */
import { agentIdTag, type AgentRegistration } from '../wire/protocol.js';
import type { LeaseSettings } from './settings.js';

/** How many of an agent's latest renewals are remembered (a heartbeat names the one it holds). */
const REMEMBERED_GRANTS = 16;
/**
 * Agent ids replaced by a successor of the same instance, remembered (the most recent) so that a late or replayed
 * heartbeat of one is refused instead of registering it again over its successor. Agent ids are made afresh by
 * every agent process, so a replaced id never comes back legitimately.
 */
const REMEMBERED_REPLACED = 4096;

/** One agent as the coordinator sees it. */
export interface Agent {
  readonly id: string;
  readonly instance: string;
  readonly region: number;
  readonly registeredAt: number;
  /** Coordinator time until which the agent may hold a lease; 0 when never renewed by this incarnation. */
  leaseUntil: number;
  lastHeartbeatAt: number | undefined;
  /** Decision requests shed per second over the interval its last heartbeat covered (0 until known). */
  shedPerSecond: number;
  appliedRevision: number;
  ackRevision: number;
  /** When this incarnation granted renewals, by heartbeat seq (the last few). */
  readonly grants: Map<number, number>;
  /**
   * Coordinator time until which the agent surely holds a valid lease: the grant of the renewal it reports
   * holding, plus the lease, minus the longest a reply may take to count (a report interval) and the skew.
   */
  surelyValidUntil: number;
  /**
   * Its last heartbeat came on an untagged subject: an agent from before credential tags, whose strict record
   * schema refuses fields it does not know (the coordinator then writes records without them).
   */
  legacy?: boolean;
  /**
   * Its registration is in the registry bucket (restored from it, or written and confirmed): until then no
   * renewal may be sent to it, so every agent that holds a lease of any incarnation is one a successor reads.
   */
  registered: boolean;
}

/** A change of the agent registry the shell must persist. */
export type RegistryWrite = { put: AgentRegistration } | { delete: string };

/** What a heartbeat tells the roster of its sender. */
export interface HeartbeatFacts {
  agentId: string;
  instance: string;
  region: number;
  /** The region's name, for the registration written. */
  regionName: string;
  appliedRevision: number;
  ackRevision: number;
  renewedSeq: number;
  /** Requests shed since the previous heartbeat. */
  shed?: number | undefined;
  /** The heartbeat came on an untagged subject (an agent from before credential tags). */
  legacy?: boolean | undefined;
  /**
   * The tag of the credential the heartbeat came with (its subject's; the shell checked the id carries it), when
   * known: an agent of another credential cannot replace this one by taking its instance name.
   */
  credential?: string | undefined;
}

/** An agent not heard from yet by this incarnation: possibly lapsed until it reports a renewal granted here. */
function newAgent(
  id: string,
  instance: string,
  region: number,
  registeredAt: number,
  leaseUntil: number,
  registered: boolean,
): Agent {
  return {
    id,
    instance,
    region,
    registeredAt,
    leaseUntil,
    lastHeartbeatAt: undefined,
    shedPerSecond: 0,
    appliedRevision: 0,
    ackRevision: 0,
    grants: new Map(),
    surelyValidUntil: -Infinity,
    registered,
  };
}

export class AgentRoster {
  readonly #lease: LeaseSettings;
  readonly #agents = new Map<string, Agent>();
  readonly #replaced = new Set<string>();
  #writes: RegistryWrite[] = [];
  /** Registrations handed to the shell and not yet confirmed written, by agent id. */
  readonly #unwritten = new Map<string, AgentRegistration>();
  /** Per region: shrinks agents must acknowledge, with the time they became visible. */
  readonly #requiredAcks: { revision: number; since: number }[][];

  constructor(lease: LeaseSettings, regionCount: number) {
    this.#lease = lease;
    this.#requiredAcks = Array.from({ length: regionCount }, () => []);
  }

  /** An agent an earlier incarnation registered: it may hold a lease for one more lease length. */
  restore(registration: AgentRegistration, region: number, now: number): void {
    this.#agents.set(
      registration.agentId,
      newAgent(
        registration.agentId,
        registration.instance,
        region,
        registration.registeredAt,
        now + this.#lease.leaseMs,
        true,
      ),
    );
  }

  get(agentId: string): Agent | undefined {
    return this.#agents.get(agentId);
  }

  /** Agents of one region. */
  *inRegion(region: number): IterableIterator<Agent> {
    for (const a of this.#agents.values()) if (a.region === region) yield a;
  }

  /**
   * Register or refresh the sender of a heartbeat and record its progress. Returns the agent, or the reason its
   * heartbeat is refused.
   */
  heard(facts: HeartbeatFacts, now: number): Agent | { refused: string } {
    let agent = this.#agents.get(facts.agentId);
    if (agent !== undefined && agent.region !== facts.region) {
      return { refused: 'agent id already registered in another region' };
    }
    if (agent === undefined && this.#replaced.has(facts.agentId)) {
      return { refused: 'agent id replaced by a newer agent of its instance' };
    }
    if (agent === undefined) {
      // A new agent with the name of an old one replaces it: instance names are unique per live agent.
      let inRegion = 0;
      let replaces: Agent | undefined;
      for (const other of this.#agents.values()) {
        if (other.region !== facts.region) continue;
        inRegion++;
        // Only the same credential may take an instance name over (a restart); another's new agent is one more.
        if (
          other.instance === facts.instance &&
          (facts.credential === undefined || agentIdTag(other.id) === facts.credential)
        )
          replaces = other;
      }
      if (replaces === undefined && inRegion >= this.#lease.maxAgentsPerRegion) {
        return { refused: `region full: ${inRegion} agents registered (maxAgentsPerRegion)` };
      }
      if (replaces !== undefined) {
        this.forget(replaces.id);
        this.#replaced.add(replaces.id);
        if (this.#replaced.size > REMEMBERED_REPLACED)
          this.#replaced.delete(this.#replaced.values().next().value!);
      }
      agent = newAgent(facts.agentId, facts.instance, facts.region, now, 0, false);
      this.#agents.set(agent.id, agent);
      const put = {
        agentId: agent.id,
        instance: agent.instance,
        region: facts.regionName,
        registeredAt: now,
      };
      this.#unwritten.set(agent.id, put);
      this.#writes.push({ put });
    }
    agent.legacy = facts.legacy === true;
    const previous = agent.lastHeartbeatAt;
    if (facts.shed !== undefined) {
      // Over the interval since the previous heartbeat; a first heartbeat covers one report interval.
      const seconds =
        Math.max(previous === undefined ? this.#lease.reportIntervalMs : now - previous, 1) / 1000;
      agent.shedPerSecond = facts.shed / seconds;
    }
    agent.lastHeartbeatAt = now;
    agent.appliedRevision = Math.max(agent.appliedRevision, facts.appliedRevision);
    agent.ackRevision = Math.max(agent.ackRevision, facts.ackRevision);
    // The heartbeat's own lease mode is not evidence: it may have waited in a buffer through an outage while the
    // lease it describes ran out. What counts is which renewal the agent says it holds; a renewal this incarnation
    // granted at time g is held until at least g + lease - report interval - skew (agents ignore replies later
    // than one report interval), and before or after that the agent counts at its safe share.
    const granted = agent.grants.get(facts.renewedSeq);
    if (granted !== undefined) {
      agent.surelyValidUntil = Math.max(
        agent.surelyValidUntil,
        granted + this.#lease.leaseMs - this.#lease.reportIntervalMs - this.#lease.skewMs,
      );
    }
    return agent;
  }

  /** The registration of `agentId` is persisted: renewals may be sent to it. */
  registrationWritten(agentId: string): void {
    const agent = this.#agents.get(agentId);
    if (agent !== undefined) agent.registered = true;
    this.#unwritten.delete(agentId);
  }

  /** Writing the registration of `agentId` failed: it is handed to the shell again. */
  registrationFailed(agentId: string): void {
    const agent = this.#agents.get(agentId);
    const put = this.#unwritten.get(agentId);
    if (agent === undefined || agent.registered || put === undefined) return;
    this.#writes.push({ put });
  }

  /**
   * Every agent this incarnation knows holds a renewal it granted and reported holding it: none may be deciding
   * with a lease of an earlier incarnation, or at its safe share.
   */
  allRenewed(now: number): boolean {
    for (const a of this.#agents.values()) if (this.possiblyLapsed(a, now)) return false;
    return true;
  }

  /** A renewal granted now, answering the heartbeat numbered `seq`. */
  grant(agent: Agent, seq: number, now: number): void {
    agent.leaseUntil = now + this.#lease.leaseMs;
    agent.grants.set(seq, now);
    if (agent.grants.size > REMEMBERED_GRANTS) agent.grants.delete(agent.grants.keys().next().value!);
  }

  /** Record an acknowledgement; false when it tells nothing new. */
  acknowledged(agent: Agent, ackRevision: number): boolean {
    if (ackRevision <= agent.ackRevision) return false;
    agent.ackRevision = ackRevision;
    return true;
  }

  /** Some registered agent is from before credential tags (see `Agent.legacy`). */
  anyLegacy(): boolean {
    for (const a of this.#agents.values()) if (a.legacy === true) return true;
    return false;
  }

  forget(agentId: string): void {
    this.#unwritten.delete(agentId);
    if (this.#agents.delete(agentId)) this.#writes.push({ delete: agentId });
  }

  /** Forget agents silent for longer than `forgetAfterMs`; returns how many. */
  forgetSilent(now: number): number {
    const after = this.#lease.forgetAfterMs;
    let forgotten = 0;
    for (const a of [...this.#agents.values()]) {
      const last = Math.max(a.leaseUntil, a.registeredAt, a.lastHeartbeatAt ?? 0);
      if (now - last > after) {
        this.forget(a.id);
        forgotten++;
      }
    }
    return forgotten;
  }

  /** Registry changes to persist since the last call. */
  takeWrites(): RegistryWrite[] {
    const out = this.#writes;
    this.#writes = [];
    return out;
  }

  /** Agents of `region` must acknowledge `revision`, visible since `since`. */
  requireAck(region: number, revision: number, since: number): void {
    this.#requiredAcks[region]!.push({ revision, since });
  }

  /** The agent has not acknowledged a shrink of its region within `timeoutMs`. */
  overdue(agent: Agent, now: number, timeoutMs: number): boolean {
    const required = this.#requiredAcks[agent.region]!;
    // Entries every registered agent of the region has acknowledged are done with.
    while (required.length > 0 && this.#allAcked(agent.region, required[0]!.revision)) required.shift();
    for (const { revision, since } of required) {
      if (agent.ackRevision < revision && now - since > timeoutMs) return true;
    }
    return false;
  }

  /** Every live agent of `region` acknowledged `revision` (lapsed ones cannot hold more than their safe share). */
  regionAcknowledged(region: number, revision: number, now: number): boolean {
    for (const a of this.inRegion(region)) {
      if (a.ackRevision < revision && !this.lapsed(a, now)) return false;
    }
    return true;
  }

  /** The agent's lease ran out, skew included. */
  lapsed(agent: Agent, now: number): boolean {
    return now > agent.leaseUntil + this.#lease.skewMs;
  }

  /**
   * The agent may be deciding at its safe share: no renewal it reported holding is surely still in force (its
   * lease lapsed, it has not reported one of this incarnation's renewals since a restart or a partition, or it
   * is new and serving before its first renewal).
   */
  possiblyLapsed(agent: Agent, now: number): boolean {
    return now > agent.surelyValidUntil;
  }

  /** Some agent of the region may be holding its safe share. */
  lapsedIn(region: number, now: number): boolean {
    for (const a of this.inRegion(region)) if (this.possiblyLapsed(a, now)) return true;
    return false;
  }

  /** Every agent of the region lapsed (and there is at least one): the region cannot be reached. */
  unreachable(region: number, now: number): boolean {
    let any = false;
    for (const a of this.inRegion(region)) {
      any = true;
      if (!this.lapsed(a, now)) return false;
    }
    return any;
  }

  /** The latest lease any agent of the region holds, or null. */
  leaseExpiry(region: number): number | null {
    let expiresAt: number | null = null;
    for (const a of this.inRegion(region)) {
      if (a.leaseUntil > 0) expiresAt = Math.max(expiresAt ?? 0, a.leaseUntil);
    }
    return expiresAt;
  }

  #allAcked(region: number, revision: number): boolean {
    for (const a of this.inRegion(region)) if (a.ackRevision < revision) return false;
    return true;
  }
}
