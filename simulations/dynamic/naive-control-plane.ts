/**
 * `naive-dynamic`: the same rebalancer as `dynamic` (core/rebalance: demand smoothed by DemandTracker, targets
 * and damped steps by nextShares, the same floor and hysteresis) without the conservation protocol. Every round
 * the coordinator sends each region the share it computed and each agent enforces what it last received (newer
 * epochs only): grows and shrinks alike, no acknowledgements, no leases, no refill floors. The vector is
 * resent every round, so a lost message is repaired one round later, and persisted, so a restarted coordinator
 * resumes from it. What it lacks is exactly what the two-phase protocol adds: a grow can land before the shrink
 * that pays for it, a region cut off keeps its share while the coordinator gives it away.
 */
import { isLogKind, type Policy } from '../../core/policy/policy.js';
import { DemandTracker } from '../../core/rebalance/demand.js';
import type { RebalanceSettings } from '../../core/rebalance/settings.js';
import { equalShares, rebalanceRound, shareFloor, targetShares } from '../../core/rebalance/target.js';
import { PolicyUsageCounter } from '../../core/shares/usage-accounting.js';
import { BucketSizing } from '../engine/bucket-sizing.js';
import { decideLog } from '../engine/log-decision.js';
import { SubjectPolicies } from '../engine/subject-classes.js';
import type { Fault } from '../scenario.js';
import type { Outcome, SimRequest, StrategyContext } from '../strategy.js';
import { InForceTracker } from './in-force.js';
import { remainingFraction } from './agent-node.js';
import { subjectName } from './subject-name.js';

export interface NaiveOptions {
  rebalance: RebalanceSettings;
  reportIntervalMs: number;
  agentsPerRegion: number;
}

/** The coordinator's memory (lost in a crash but for `#persisted`). */
interface NaiveCoordinator {
  shares: number[];
  epoch: number;
  /** A rebalance is under way (the rebalancer's two thresholds). */
  moving: boolean;
  /** The target of the last round, to tell whether it is still moving. */
  lastIdeal: number[] | undefined;
  demand: DemandTracker<string>;
  unmet: DemandTracker<string>;
  /** When each region's last usage report arrived (ms). */
  lastUsageAt: (number | undefined)[];
}

interface NaiveAgent {
  id: string;
  region: number;
  handle: number;
  epoch: number;
  sizing: BucketSizing;
  meter: PolicyUsageCounter;
  lastReportUs: number;
}

export class NaiveControlPlane {
  readonly #ctx: StrategyContext;
  readonly #options: NaiveOptions;
  readonly #policy: Policy;
  readonly #policies: SubjectPolicies;
  readonly #floor: number;
  readonly #tracker: InForceTracker;
  readonly #byRegion: NaiveAgent[][];
  readonly #turn: number[];
  readonly #endUs: number;
  /** What survives a coordinator crash (its KV record). */
  #persisted: { shares: number[]; epoch: number };
  #coordinator: NaiveCoordinator | undefined;
  #incarnation = 0;

  constructor(ctx: StrategyContext, options: NaiveOptions) {
    this.#ctx = ctx;
    this.#options = options;
    this.#policy = ctx.policy;
    this.#policies = new SubjectPolicies(ctx.policy);
    this.#floor = shareFloor(ctx.policy.capacity, ctx.policy.maxCost, ctx.policy.minShare, options.rebalance);
    this.#tracker = new InForceTracker(ctx.regions.length, (unit, shares) => ctx.sharesInForce(unit, shares));
    this.#byRegion = ctx.regions.map(() => []);
    this.#turn = ctx.regions.map(() => 0);
    this.#endUs = ctx.settings.durationS * 1e6;
    this.#persisted = { shares: equalShares(ctx.regions.length), epoch: 0 };
  }

  /** At virtual time 0 every agent holds the equal split (the same start as `dynamic`). */
  start(): void {
    const ctx = this.#ctx;
    const interval = this.#options.reportIntervalMs * 1000;
    ctx.regions.forEach((name, region) => {
      for (let k = 0; k < this.#options.agentsPerRegion; k++) {
        const first = 1 + ctx.random.int(interval);
        const agent: NaiveAgent = {
          id: `agent-${name}-${k + 1}`,
          region,
          handle: this.#tracker.add(region),
          epoch: 0,
          sizing: new BucketSizing(this.#policy, this.#persisted.shares[region]!),
          meter: new PolicyUsageCounter(),
          // Running before virtual time 0: the first report covers a whole interval, like the others.
          lastReportUs: first - interval,
        };
        this.#byRegion[region]!.push(agent);
        this.#tracker.set(agent.handle, undefined, agent.sizing.share);
        const report = () => {
          if (ctx.now() >= this.#endUs) return;
          this.#report(agent);
          ctx.at(ctx.now() + interval, report);
        };
        ctx.at(first, report);
      }
    });
    this.#startCoordinator();
  }

  decide(request: SimRequest): Outcome {
    const agents = this.#byRegion[request.region]!;
    const turn = this.#turn[request.region]!;
    this.#turn[request.region] = turn + 1;
    const agent = agents[turn % agents.length]!;
    if (isLogKind(this.#policy.kind)) {
      // No share history: a log is sized by the share it holds now, as without the protocol.
      const store = this.#ctx.stores[request.region]!;
      const log = decideLog(
        this.#policy,
        store,
        request.subject,
        request.cost,
        agent.sizing.share,
        request.at,
      );
      agent.meter.record(
        subjectName(request.subject),
        request.cost,
        log.outcome.allowed,
        remainingFraction(log.remaining, log.limit),
      );
      return log.outcome;
    }
    const check = agent.sizing.check(request.cost, request.subject);
    const result = this.#ctx.stores[request.region]!.decide(request.subject, check, request.at);
    agent.meter.record(
      subjectName(request.subject),
      request.cost,
      result.allowed,
      remainingFraction(result.remaining, check.capacity),
      this.#policies.of(request.subject).refillPerSecond,
    );
    return { allowed: result.allowed, retryAfterMs: result.retryAfterMs, decidedAt: request.at };
  }

  shares(): number[] {
    return this.#tracker.policyShares();
  }

  onFault(fault: Fault): void {
    if (fault.kind === 'coordinator-down') {
      this.#coordinator = undefined;
      this.#incarnation++;
    } else if (fault.kind === 'coordinator-up') this.#startCoordinator();
  }

  #startCoordinator(): void {
    const incarnation = ++this.#incarnation;
    this.#coordinator = {
      shares: [...this.#persisted.shares],
      epoch: this.#persisted.epoch,
      moving: false,
      lastIdeal: undefined,
      demand: new DemandTracker(this.#options.rebalance.demandHalfLifeMs),
      unmet: new DemandTracker(this.#options.rebalance.demandHalfLifeMs),
      lastUsageAt: this.#ctx.regions.map(() => undefined),
    };
    const ctx = this.#ctx;
    const roundUs = this.#options.rebalance.roundMs * 1000;
    const round = () => {
      if (this.#incarnation !== incarnation || ctx.now() >= this.#endUs) return;
      this.#round();
      ctx.at(ctx.now() + roundUs, round);
    };
    ctx.at(ctx.now() + roundUs, round);
  }

  /** Step toward demand and send every region its share, applied on receipt. */
  #round(): void {
    const c = this.#coordinator!;
    const ctx = this.#ctx;
    const nowMs = ctx.now() / 1000;
    const zeros = () => new Array<number>(ctx.regions.length).fill(0);
    const stale = 3 * this.#options.reportIntervalMs;
    const demand = {
      demand: c.demand.sumByTag(nowMs, zeros()),
      unmet: c.unmet.sumByTag(nowMs, zeros()),
      known: c.lastUsageAt.map((at) => at !== undefined && nowMs - at <= stale),
    };
    // The engine's round (core/rebalance targetShares and rebalanceRound), without the protocol around it.
    const next = rebalanceRound(
      c,
      targetShares(c.shares, demand, this.#floor),
      this.#floor,
      this.#options.rebalance,
      { now: nowMs, demand },
    );
    if (next !== undefined) {
      c.shares = next;
      c.epoch++;
      this.#persisted = { shares: [...next], epoch: c.epoch };
      ctx.count('shareChanges');
    }
    const { shares, epoch } = c;
    for (const agents of this.#byRegion) {
      for (const agent of agents) {
        const share = shares[agent.region]!;
        ctx.network.send(ctx.coordinator, agent.region, 'control', () => {
          if (epoch <= agent.epoch) return;
          agent.epoch = epoch;
          if (share === agent.sizing.share) return;
          agent.sizing = new BucketSizing(this.#policy, share);
          this.#tracker.set(agent.handle, undefined, share);
        });
      }
    }
  }

  /** An agent's usage report: requested cost over the interval, as `dynamic` agents report it. */
  #report(agent: NaiveAgent): void {
    const ctx = this.#ctx;
    const now = ctx.now();
    const intervalMs = Math.max(1, Math.round((now - agent.lastReportUs) / 1000));
    agent.lastReportUs = now;
    const usage = agent.meter.take(this.#policy.name, intervalMs, this.#policy.refillPerSecond);
    ctx.network.send(agent.region, ctx.coordinator, 'control', () => {
      const c = this.#coordinator;
      if (c === undefined) return;
      const at = ctx.now() / 1000;
      const key = `${agent.region}/${agent.id}`;
      const demand = usage.demand ?? usage.requested;
      c.lastUsageAt[agent.region] = at;
      c.demand.observe(key, demand, intervalMs, at, agent.region);
      c.unmet.observe(key, Math.max(0, demand - usage.admitted), intervalMs, at, agent.region);
    });
  }
}
