/**
 * A world of regional agents on the models: each region runs the agent's real decision path (DecisionService,
 * Borrower, LoanResponder, strict forwarding) over its own in-memory store (the reference
 * models of the Lua scripts), all on one manual clock. Regions talk through in-process calls that a NATS cut
 * breaks; a region's store can be frozen (every call fails, as a store that stopped answering); an agent can be
 * restarted (its memory is lost, its store is kept); shares move as the coordinator moves them (shrink first,
 * grow once the shrink is in force). Used by the conservation property suite (test/unit/core/lease/conservation-property.test.ts).
 */
import { trace } from '@opentelemetry/api';
import { pino } from 'pino';
import type { NatsConnection } from '@nats-io/nats-core';
import { loanAnswer } from '../../core/borrowing/lender.js';
import { BorrowPlanner, type LoanAnswer } from '../../core/borrowing/planner.js';
import { creditOnModel, lendOnModel } from '../../core/models/transfer.js';
import type { DecisionRequest } from '../../core/wire/agent.js';
import { ManualClock } from '../../core/clock.js';
import { ShareHistory } from '../../core/lease/share-history.js';
import type { Policy } from '../../core/policy/policy.js';
import type { RegionalShare, ShareView } from '../../core/shares/shares.js';
import type { LoanRequest, LoanReply } from '../../core/wire/loan.js';
import { LoanResponder } from '../../regional-agent/borrowing/loan-responder.js';
import { Borrower } from '../../regional-agent/borrowing/borrower.js';
import type { TransferStore } from '../../regional-agent/borrowing/transfer-store.js';
import { DecisionService, type DecisionOutcome } from '../../regional-agent/decisions/decision-service.js';
import type { DecisionStore } from '../../regional-agent/decisions/decision-store.js';
import { EmergencyBuckets } from '../../regional-agent/decisions/emergency-buckets.js';
import type { Forwarder, ForwardRequest, ForwardResult } from '../../regional-agent/decisions/forwarder.js';
import { ModelDecisionStore } from '../../regional-agent/decisions/model-decision-store.js';
import { ModelGrantStore, type GrantStore } from '../../regional-agent/grants/grant-store.js';
import { returnGrant, takeGrant, type GrantsRouteOptions } from '../../regional-agent/http/grants-route.js';
import { batchElements } from '../../regional-agent/http/batch-route.js';
import { AgentErrors } from '../../regional-agent/errors.js';
import { AgentMetrics } from '../../regional-agent/observability/metrics.js';
import { StaticPolicySource } from '../../regional-agent/policies/static-policy-source.js';
import { StoreGuard } from '../../regional-agent/resilience/store-guard.js';
import { ReservationService } from '../../regional-agent/reservations/reservation-service.js';
import { ModelReservationStore } from '../../regional-agent/reservations/reservation-store.js';

export const WORLD_EPOCH_MS = 1_750_000_000_000;
const log = pino({ level: 'silent' });
const tracer = trace.getTracer('model-world');
/** One metrics registry per region name, shared by every world (they only count). */
const metricsByRegion = new Map<string, AgentMetrics>();
const metricsFor = (region: string) => {
  let m = metricsByRegion.get(region);
  if (m === undefined) metricsByRegion.set(region, (m = new AgentMetrics({ region })));
  return m;
};

/**
 * Shares of every policy by region, as the coordinator issued them; each region keeps its own history, and the
 * coordinator's (`issued`, the lowest shares its allocation records carry) reaches restarted agents.
 */
class WorldShares {
  readonly table = new Map<string, Map<string, number>>();
  /** The coordinator's memory of what it issued, per region (core/lease/allocation-records.ts `lowest`). */
  readonly issued = new Map<string, ShareHistory>();
  constructor(
    readonly policies: readonly Policy[],
    readonly regions: readonly string[],
    readonly clock: ManualClock,
  ) {
    for (const p of policies) this.table.set(p.name, new Map(regions.map((r) => [r, 1 / regions.length])));
    for (const r of regions) this.issued.set(r, new ShareHistory(0));
    for (const r of regions) this.noteIssued(r);
  }
  share(policy: string, region: string): number {
    return this.table.get(policy)?.get(region) ?? 0;
  }
  noteIssued(region: string): void {
    for (const p of this.policies)
      this.issued.get(region)!.push(p.name, this.share(p.name, region), this.clock.now(), p.idleTtlSeconds);
  }
}

/** One region's view of the shares: its own share, with the floors of its (agent-memory) history. */
class RegionShares implements ShareView {
  history = new ShareHistory(0);
  constructor(
    readonly world: WorldShares,
    readonly region: string,
    readonly clock: ManualClock,
  ) {
    this.remember();
  }
  /** Note every policy's share now (at start, and after each change). */
  remember(): void {
    for (const p of this.world.policies)
      this.history.push(p.name, this.world.share(p.name, this.region), this.clock.now(), p.idleTtlSeconds);
  }
  shareFor(policy: string): RegionalShare | undefined {
    const p = this.world.policies.find((x) => x.name === policy);
    if (p === undefined) return undefined;
    const share = this.world.share(policy, this.region);
    const now = this.clock.now();
    const window = p.idleTtlSeconds * 1000;
    const out: RegionalShare = { share, epoch: 1 };
    const floor = this.history.floor(policy, share, window, now);
    if (floor !== undefined) out.floor = floor;
    // The agent's own memory and the coordinator's record, as regional-agent's AgentLease reads both.
    const lowest = Math.min(
      this.history.lowest(policy, share, window, now),
      this.world.issued.get(this.region)!.lowest(policy, share, window, now),
    );
    if (lowest < share) out.lowest = lowest;
    return out;
  }
  regionShares(policy: string): Readonly<Record<string, number>> {
    return Object.fromEntries(this.world.table.get(policy) ?? []);
  }
  enter(): () => void {
    return () => undefined;
  }
}

/** A store that fails every call while its region's Redis is frozen. */
class FreezableStore implements DecisionStore, TransferStore {
  frozen = false;
  constructor(
    readonly inner: ModelDecisionStore,
    readonly clock: ManualClock,
  ) {}
  #call<T>(f: () => Promise<T>): Promise<T> {
    return this.frozen ? Promise.reject(new Error('ETIMEDOUT: the store is frozen')) : f();
  }
  decide: DecisionStore['decide'] = (r) => this.#call(() => this.inner.decide(r));
  slotOf = (key: string) => this.inner.slotOf(key);
  decideLog: DecisionStore['decideLog'] = (r) => this.#call(() => this.inner.decideLog(r));
  refundLog: DecisionStore['refundLog'] = (r) => this.#call(() => this.inner.refundLog(r));
  takeCreation: DecisionStore['takeCreation'] = (r) => this.#call(() => this.inner.takeCreation(r));
  decideDay: DecisionStore['decideDay'] = (r) => this.#call(() => this.inner.decideDay(r));
  refundDay: DecisionStore['refundDay'] = (r) => this.#call(() => this.inner.refundDay(r));
  refund: DecisionStore['refund'] = (r) => this.#call(() => this.inner.refund(r));
  claim: DecisionStore['claim'] = (k, f, t, p) => this.#call(() => this.inner.claim(k, f, t, p));
  lend: TransferStore['lend'] = (l) =>
    this.#call(() => Promise.resolve(lendOnModel(this.inner.model.buckets, l, this.#micros())));
  credit: TransferStore['credit'] = (c) =>
    this.#call(() => Promise.resolve(creditOnModel(this.inner.model.buckets, c, this.#micros())));
  #micros(): number {
    return Math.round(this.clock.now() * 1000);
  }
}

export interface WorldOptions {
  regions?: readonly string[];
  policies: readonly Policy[];
  borrowing: boolean;
  /** [0, 1) draws (shard picks, message delays): seeded by the caller for reproducible cases. */
  random: () => number;
  clock?: ManualClock;
}

/** One region: its store lives across restarts, its agent does not. */
export class WorldRegion {
  readonly store: FreezableStore;
  shares: RegionShares;
  service!: DecisionService;
  reservations!: ReservationService;
  /** The region's reservation records live in its store (Redis), across agent restarts. */
  readonly reservationStore: ModelReservationStore;
  #emergency!: EmergencyBuckets;
  #planner!: BorrowPlanner;
  #lender!: LoanResponder;
  #guard: StoreGuard | undefined;
  cut = false;

  constructor(
    readonly world: ModelWorld,
    readonly name: string,
  ) {
    this.store = new FreezableStore(new ModelDecisionStore(world.clock), world.clock);
    this.reservationStore = new ModelReservationStore(world.clock);
    this.shares = new RegionShares(world.shares, name, world.clock);
    this.restart();
  }

  /** A new agent process: empty memory (share history, borrow planner, emergency buckets), the same store. */
  restart(): void {
    this.#emergency?.close();
    const { world } = this;
    this.shares = new RegionShares(world.shares, this.name, world.clock);
    const metrics = metricsFor(this.name);
    this.#emergency = new EmergencyBuckets(world.clock, { fraction: 0.1, maxBuckets: 10_000 });
    this.#planner = new BorrowPlanner({ maxLenders: 16, maxEntries: 10_000, unreachableBackoffMs: 1000 });
    const borrower = world.options.borrowing
      ? new Borrower({
          region: this.name,
          planner: this.#planner,
          shares: this.shares,
          store: this.store,
          ask: (lender, request) => world.ask(this.name, lender, request),
          clock: world.clock,
          reserveMs: 5,
          lowWater: 0.5,
          topUpMs: 200,
        })
      : undefined;
    this.#lender = new LoanResponder({
      // Only its subscription uses the connection; the world calls `answer` directly.
      nc: undefined as unknown as NatsConnection,
      region: this.name,
      policies: new StaticPolicySource(world.options.policies),
      shares: this.shares,
      store: this.store,
      monotonic: () => world.clock.now(),
    });
    this.#guard?.shutdown();
    // The breaker never opens here: a failure mode applies exactly while the store is frozen.
    const guard = (this.#guard = new StoreGuard(
      { errorPercent: 100, volumeThreshold: 10_000, resetMs: 1000, windowMs: 10_000 },
      metrics,
      tracer,
    ));
    this.service = new DecisionService(
      {
        store: this.store,
        guard,
        policies: new StaticPolicySource(world.options.policies),
        shares: this.shares,
        emergency: this.#emergency,
        metrics,
        clock: world.clock,
        random: world.options.random,
        log,
        forwarder: world.forwarder(this.name),
        shortfall: borrower,
      },
      {
        region: this.name,
        deadlineMs: 1000,
        idempotencyTtlMs: 3_600_000,
        failureRetryAfterMs: 1000,
        logSampleRate: 0,
      },
    );
    this.reservations = this.#reservationsFor(guard, metrics);
    const grants = new ModelGrantStore(this.store.inner.model.buckets, world.clock);
    const frozen = () => this.store.frozen;
    const grantStore: GrantStore = {
      take: (g) => (frozen() ? Promise.reject(new Error('ETIMEDOUT: the store is frozen')) : grants.take(g)),
      giveBack: (g) =>
        frozen() ? Promise.reject(new Error('ETIMEDOUT: the store is frozen')) : grants.giveBack(g),
    };
    this.grants = { service: this.service, store: grantStore, guard, shares: this.shares, metrics };
  }

  /** The agent's local grants (`POST /v1/grants` and `/v1/grants/return` without HTTP). */
  grants!: Omit<GrantsRouteOptions, 'assertServing'>;

  /** The reservation service of the agent now running (regional-agent/reservations). */
  #reservationsFor(guard: StoreGuard, metrics: AgentMetrics): ReservationService {
    const { world } = this;
    const frozen = () => this.store.frozen;
    const records = this.reservationStore;
    // The records are in the region's Redis: frozen with it.
    const reservations = new Proxy(records, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver) as unknown;
        if (typeof v !== 'function') return v;
        return (...args: unknown[]) =>
          frozen()
            ? Promise.reject(new Error('ETIMEDOUT: the store is frozen'))
            : (v as (...a: unknown[]) => unknown).apply(target, args);
      },
    });
    return new ReservationService({
      service: this.service,
      store: this.store,
      reservations,
      guard,
      metrics,
      log,
      region: this.name,
      now: () => world.clock.now(),
    });
  }

  /** Answer a loan request: the agent's own LoanResponder, without its NATS subscription. */
  lend(value: unknown): Promise<LoanReply> {
    return this.#lender.answer(value);
  }

  close(): void {
    this.#emergency.close();
    this.#guard?.shutdown();
  }
}

export class ModelWorld {
  readonly clock: ManualClock;
  readonly shares: WorldShares;
  readonly regions = new Map<string, WorldRegion>();

  constructor(readonly options: WorldOptions) {
    this.clock = options.clock ?? new ManualClock(WORLD_EPOCH_MS);
    const names = options.regions ?? ['us', 'eu', 'ap'];
    this.shares = new WorldShares(options.policies, names, this.clock);
    for (const name of names) this.regions.set(name, new WorldRegion(this, name));
  }

  region(name: string): WorldRegion {
    const r = this.regions.get(name);
    if (r === undefined) throw new Error(`no region ${name}`);
    return r;
  }

  /** A few microtask turns, drawn from the world's random: messages overtake each other. */
  async #jitter(): Promise<void> {
    const turns = Math.floor(this.options.random() * 4);
    for (let i = 0; i < turns; i++) await Promise.resolve();
  }

  async ask(from: string, lender: string, request: LoanRequest): Promise<LoanAnswer> {
    await this.#jitter();
    const to = this.regions.get(lender);
    if (to === undefined || to.cut || this.region(from).cut) return { kind: 'unreachable' };
    const reply = await to.lend(request);
    await this.#jitter();
    return loanAnswer(reply, 1);
  }

  forwarder(from: string): Forwarder {
    return {
      decide: async (homeRegion: string, request: ForwardRequest): Promise<ForwardResult> => {
        await this.#jitter();
        const home = this.regions.get(homeRegion);
        if (home === undefined || home.cut || this.region(from).cut)
          throw new Error(`home region ${homeRegion} is unreachable`);
        const reply = await home.service.decideForwarded(
          {
            fromRegion: from,
            checks: request.checks,
            idempotencyKey: request.idempotencyKey,
            dryRun: request.dryRun,
            budgetMs: 1000,
            deadlineAtMs: this.clock.now() + 1000,
          },
          'forwarded',
        );
        if ('error' in reply) {
          if (reply.error === 'idempotency_conflict')
            throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT(reply.message);
          throw new Error(`home region ${homeRegion}: ${reply.message}`);
        }
        return reply;
      },
    };
  }

  /** Decide a body in `region`: the outcome, or the agent error a caller would get as a 4xx. */
  async decide(region: string, body: DecisionRequest | object): Promise<DecisionOutcome | { error: string }> {
    try {
      return await this.region(region).service.decideBody(body, 'world');
    } catch (error) {
      if (error instanceof Error && 'code' in error) return { error: String(error.code) };
      throw error;
    }
  }

  /**
   * `POST /v1/decisions/batch` in `region`: the elements decided independently, all started in one turn, as the
   * batch route does (regional-agent/http/batch-route.ts); a malformed batch is one error.
   */
  async decideBatch(
    region: string,
    body: object,
  ): Promise<(DecisionOutcome | { error: string })[] | { error: string }> {
    let elements: unknown[];
    try {
      elements = batchElements(body);
    } catch (error) {
      if (error instanceof Error && 'code' in error) return { error: String(error.code) };
      throw error;
    }
    return Promise.all(elements.map((e) => this.decide(region, e as object)));
  }

  /** Take a local grant in `region` (or the 4xx/503 code a client would get). */
  async takeGrant(
    region: string,
    body: { policy: string; subject: string; amount: number },
  ): Promise<{ granted: number; grant: string | null } | { error: string }> {
    try {
      return await takeGrant(this.region(region).grants, body);
    } catch (error) {
      if (error instanceof Error && 'code' in error) return { error: String(error.code) };
      throw error;
    }
  }

  /** Hand back tokens of local grant `grant` in `region` (the id its take answered). */
  async returnGrant(
    region: string,
    body: { policy: string; subject: string; grant: string; amount: number },
  ): Promise<{ credited: number } | { error: string }> {
    try {
      return await returnGrant(this.region(region).grants, body);
    } catch (error) {
      if (error instanceof Error && 'code' in error) return { error: String(error.code) };
      throw error;
    }
  }

  /**
   * Move share as the coordinator does: `shrink` the giver now (answers what it gave), and `grow` the taker
   * once every decision under the giver's old share is over (never above a sum of 1).
   */
  shrink(policy: string, from: string, amount: number): number {
    const shares = this.shares.table.get(policy)!;
    const give = Math.min(amount, shares.get(from) ?? 0);
    shares.set(from, (shares.get(from) ?? 0) - give);
    this.shares.noteIssued(from);
    this.region(from).shares.remember();
    return give;
  }

  grow(policy: string, to: string, amount: number): void {
    const shares = this.shares.table.get(policy)!;
    const sum = [...shares.values()].reduce((a, b) => a + b, 0);
    const take = Math.max(0, Math.min(amount, 1 - sum));
    shares.set(to, (shares.get(to) ?? 0) + take);
    this.shares.noteIssued(to);
    this.region(to).shares.remember();
  }

  close(): void {
    for (const r of this.regions.values()) r.close();
  }
}
