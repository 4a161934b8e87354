/**
 * Strict mode's forwarder over NATS: a check of a policy homed in another region goes, by request/reply, to
 * the queue group of that region's agents, which decide on their Redis. No answer within the budget (timeout,
 * no responders, an error answer) throws, and the policy's failure mode applies (`home_unreachable`).
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { Counter, Histogram, type Registry } from 'prom-client';
import { DEFAULT_KV_NAMESPACE } from '../../core/wire/kv.js';
import {
  farthestRoundTrip,
  linkAllowanceMs,
  oneWayAllowanceMs,
  roundTripOf,
  UNMEASURED_ROUND_TRIP_MS,
  type RoundTrips,
} from '../../core/distance.js';
import type { ShedPath } from '../../core/wire/agent.js';
import {
  ForwardedBatchReply,
  ForwardedReply,
  homeShedOf,
  MAX_FORWARD_BATCH,
  strictSubject,
  type ForwardedDecision,
} from '../../core/wire/strict.js';
import {
  HomeOverloadedError,
  type ForwardRequest,
  type ForwardResult,
  type Forwarder,
} from '../decisions/forwarder.js';
import { onTheWire } from '../resilience/wire-timeout.js';
import { AgentErrors } from '../errors.js';

/** The home region did not answer usefully; carries why, for logs and metrics. */
export class HomeUnreachableError extends Error {
  readonly code = 'AGT_HOME_UNREACHABLE';
  readonly outcome: ForwardOutcome;
  constructor(outcome: ForwardOutcome, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'HomeUnreachableError';
    this.outcome = outcome;
  }
}

export type ForwardOutcome =
  'ok' | 'timeout' | 'no_responders' | 'error_reply' | 'bad_reply' | 'disconnected' | 'overloaded';

export interface NatsForwarderOptions {
  nc: NatsConnection;
  /** This agent's region (sent along, for the home's logs). */
  region: string;
  namespace?: string;
  registry?: Registry;
  /** Round trips from this region to the others (config `roundTrips`); a home it does not name is measured. */
  roundTrips?: RoundTrips | undefined;
}

/** One decision waiting to leave in its home's next batch. */
interface Queued {
  body: ForwardedDecision;
  budget: number;
  settle: (reply: { ok: true; raw: unknown } | { ok: false; error: unknown }) => void;
}

/** A home region that answered within this long is alive: a timeout from it means busy, not unreachable. */
const ALIVE_MS = 5000;
/** Time kept for a home's answer to leave it, ms, besides one way of the link (never more than half the budget). */
const RETURN_MS = 100;
/** Weight of a new sample in a home's measured round trip. */
const RTT_WEIGHT = 0.2;

export class NatsForwarder implements Forwarder {
  readonly #options: NatsForwarderOptions;
  readonly #namespace: string;
  readonly #decisions: Counter<'home' | 'outcome'> | undefined;
  readonly #seconds: Histogram<'home'> | undefined;
  readonly #shed: Counter<'home' | 'path'> | undefined;
  /** When each home region last answered (epoch ms): a home that answers others is busy, not unreachable. */
  readonly #lastAnswer = new Map<string, number>();
  /** Round trips measured to each home (answered requests, smoothed), ms. */
  readonly #measured = new Map<string, number>();
  /** The longest round trip the configured matrix names from this region, ms (0: none). */
  readonly #configuredFarthest: number;
  /** Homes this agent's policies may forward to (expectHomes): each counts, measured or not. */
  #expected: ReadonlySet<string> = new Set();
  /** Homes a decision was forwarded to: each counts from then on, measured or not. */
  readonly #forwardedTo = new Set<string>();
  /**
   * farthestAllowanceMs, kept: every decision request reads it (its answer's header), and it changes only when a
   * measured round trip or the set of homes does.
   */
  #farthestAllowance: number;
  /** Decisions waiting for their home's next batch, by home. */
  readonly #queues = new Map<string, Queued[]>();

  constructor(options: NatsForwarderOptions) {
    this.#options = options;
    this.#namespace = options.namespace ?? DEFAULT_KV_NAMESPACE;
    this.#configuredFarthest = farthestRoundTrip(options.roundTrips ?? new Map(), options.region);
    this.#farthestAllowance = linkAllowanceMs(this.#configuredFarthest);
    if (options.registry !== undefined) {
      const registers = [options.registry];
      this.#decisions = new Counter({
        name: 'quotaplane_forwarded_decisions_total',
        help: 'Strict-mode decisions forwarded to a home region, by home and outcome.',
        labelNames: ['home', 'outcome'],
        registers,
      });
      this.#seconds = new Histogram({
        name: 'quotaplane_forwarded_decision_seconds',
        help: 'Round trip of forwarded strict-mode decisions that got an answer.',
        labelNames: ['home'],
        buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25],
        registers,
      });
      this.#shed = new Counter({
        name: 'quotaplane_forwarded_shed_total',
        help: 'Strict-mode decisions forwarded to a home region and shed (503 AGT_ERR_OVERLOADED), by home and path (forward_timeout, home_late, home_admission, home_store_deadline, home_other).',
        labelNames: ['home', 'path'],
        registers,
      });
    }
  }

  async decide(homeRegion: string, request: ForwardRequest, budgetMs: number): Promise<ForwardResult> {
    const { nc, region } = this.#options;
    const budget = Math.max(1, Math.floor(budgetMs));
    if (nc.isClosed() || nc.isDraining()) this.#fail(homeRegion, 'disconnected', 'not connected to NATS');
    if (!this.#forwardedTo.has(homeRegion)) {
      // From now on the header covers this home's wait, measured or not (a forwarder told no homes learns them
      // here; one told by the agent's policies already counts it).
      this.#forwardedTo.add(homeRegion);
      this.#refreshFarthest();
    }
    const roundTrip = this.roundTripMs(homeRegion);
    const body: ForwardedDecision = {
      fromRegion: region,
      checks: request.checks.map((c) =>
        c.class === undefined
          ? { policy: c.policy, subject: c.subject, cost: c.cost }
          : { policy: c.policy, subject: c.subject, cost: c.cost, class: c.class },
      ),
      dryRun: request.dryRun,
      budgetMs: budget,
      // The home must have charged before the budget's end less the time its answer needs to travel back (one
      // way of the link with its margin, and RETURN_MS; at most half the budget), so a grant is not lost to a
      // caller that stopped waiting.
      deadlineAtMs:
        Date.now() + budget - Math.min(RETURN_MS + oneWayAllowanceMs(roundTrip), Math.floor(budget / 2)),
      ...(request.idempotencyKey === undefined ? {} : { idempotencyKey: request.idempotencyKey }),
    };
    const started = performance.now();
    let raw: unknown;
    try {
      // The budget is kept on the wire (a reply already received is never timed out by our own busy loop);
      // the client's own timer only cleans up after it.
      raw = await onTheWire(this.#enqueue(homeRegion, body, budget), budget, `home region ${homeRegion}`);
    } catch (error) {
      const text = error instanceof Error ? `${error.name} ${error.message}` : String(error);
      const outcome: ForwardOutcome = /no responders|503/i.test(text) ? 'no_responders' : 'timeout';
      const answered = this.#lastAnswer.get(homeRegion);
      if (outcome === 'timeout' && answered !== undefined && Date.now() - answered < ALIVE_MS) {
        // No reply in time from a home that keeps answering others: it is busy. Its agents answer `overloaded`
        // to requests they take up too late, and charge nothing for them.
        this.#overloaded(homeRegion, 'forward_timeout');
        throw new HomeOverloadedError(
          homeRegion,
          'forward_timeout',
          `home region ${homeRegion} is busy: no reply in ${budget} ms`,
        );
      }
      this.#fail(homeRegion, outcome, `home region ${homeRegion}: ${outcome.replace('_', ' ')}`, error);
    }
    const parsed = ForwardedReply.safeParse(raw);
    if (!parsed.success)
      this.#fail(homeRegion, 'bad_reply', `home region ${homeRegion} answered something malformed`);
    const reply = parsed.data;
    this.#lastAnswer.set(homeRegion, Date.now());
    if ('error' in reply) {
      if (reply.error === 'overloaded') {
        const why = homeShedOf(reply.message);
        const path: ShedPath = why === undefined ? 'home_other' : `home_${why}`;
        this.#overloaded(homeRegion, path);
        throw new HomeOverloadedError(homeRegion, path, `home region ${homeRegion}: ${reply.message}`);
      }
      if (reply.error === 'idempotency_conflict') {
        this.#decisions?.inc({ home: homeRegion, outcome: 'error_reply' });
        throw new AgentErrors.AGT_ERR_IDEMPOTENCY_CONFLICT();
      }
      this.#fail(homeRegion, 'error_reply', `home region ${homeRegion}: ${reply.error}: ${reply.message}`);
    }
    if (reply.results.length !== request.checks.length) {
      this.#fail(
        homeRegion,
        'bad_reply',
        `home region ${homeRegion} answered ${reply.results.length} results for ${request.checks.length} checks`,
      );
    }
    this.#decisions?.inc({ home: homeRegion, outcome: 'ok' });
    const took = performance.now() - started;
    this.#seconds?.observe({ home: homeRegion }, took / 1000);
    this.#measure(homeRegion, took);
    return { results: reply.results, replayed: reply.replayed === true };
  }

  /**
   * The round trip to `home`, ms: the configured one (config `roundTrips`), else what answers from it took
   * (smoothed), else UNMEASURED_ROUND_TRIP_MS (before its first answer: a far home's first checks get the time
   * the link needs, where 0 gave them none and a burst could time out against a live home).
   */
  roundTripMs(home: string): number {
    const configured = roundTripOf(this.#options.roundTrips ?? new Map(), this.#options.region, home);
    return configured ?? Math.round(this.#measured.get(home) ?? UNMEASURED_ROUND_TRIP_MS);
  }

  /** Time a decision may wait for `home` beyond its local deadline: the round trip to it and its margin. */
  linkAllowanceMs(home: string): number {
    return linkAllowanceMs(this.roundTripMs(home));
  }

  /**
   * The largest allowance of any home a decision here may wait for, ms: every home the configured matrix names,
   * every home expected (expectHomes) or forwarded to, each at its roundTripMs, so a home not measured yet counts
   * UNMEASURED_ROUND_TRIP_MS, as its forwards wait (0: no home at all).
   */
  farthestAllowanceMs(): number {
    return this.#farthestAllowance;
  }

  /**
   * The homes this agent's policies may forward to now (strict policies homed in another region); replaces the
   * previous set. A home forwarded to stays counted.
   */
  expectHomes(homes: Iterable<string>): void {
    this.#expected = new Set([...homes].filter((home) => home !== this.#options.region));
    this.#refreshFarthest();
  }

  /** Fold an answer from `home` that took `took` ms into its measured round trip, and the farthest allowance. */
  #measure(home: string, took: number): void {
    const before = this.#measured.get(home);
    this.#measured.set(home, before === undefined ? took : before + RTT_WEIGHT * (took - before));
    this.#refreshFarthest();
  }

  /** Keep farthestAllowanceMs: the configured farthest, and each expected or forwarded-to home's round trip. */
  #refreshFarthest(): void {
    let most = this.#configuredFarthest;
    for (const home of this.#expected) most = Math.max(most, this.roundTripMs(home));
    for (const home of this.#forwardedTo) most = Math.max(most, this.roundTripMs(home));
    this.#farthestAllowance = linkAllowanceMs(most);
  }

  /**
   * Send `body` in `home`'s next batch: every decision forwarded to one home by the task running now (an I/O
   * callback and the promise chains it sets off: one HTTP request, one batch of them, one store reply) leaves in
   * one request once that task's microtasks are done (a lone one as a plain decision). Resolves with the home's
   * reply to this decision.
   *
   * Not at the end of the event-loop turn (`setImmediate`): a burst of new connections fills one poll phase with
   * hundreds of callbacks, and a decision queued early in it waited for all of them while its deadline (and the
   * home's slack, about 150 ms) ran. In the geo acceptance at load 9 the first 37 forwarded checks waited
   * 380-410 ms to leave, and all 37 were shed.
   */
  #enqueue(home: string, body: ForwardedDecision, budget: number): Promise<unknown> {
    return new Promise<unknown>((resolve, reject) => {
      const settle: Queued['settle'] = (r) => {
        if (r.ok) resolve(r.raw);
        else reject(r.error instanceof Error ? r.error : new Error(String(r.error)));
      };
      const queue = this.#queues.get(home);
      if (queue !== undefined) {
        queue.push({ body, budget, settle });
        return;
      }
      this.#queues.set(home, [{ body, budget, settle }]);
      // Called from a promise chain, a tick runs once every microtask queued meanwhile has run: the decisions
      // of this task's other chains (a batch's elements, a store reply's waiters) join the batch first.
      process.nextTick(() => this.#flush(home));
    });
  }

  #flush(home: string): void {
    const queue = this.#queues.get(home) ?? [];
    this.#queues.delete(home);
    for (let i = 0; i < queue.length; i += MAX_FORWARD_BATCH)
      this.#send(home, queue.slice(i, i + MAX_FORWARD_BATCH));
  }

  #send(home: string, items: Queued[]): void {
    const { nc, region } = this.#options;
    const subject = strictSubject(this.#namespace, home).subject;
    const longest = Math.max(...items.map((q) => q.budget));
    const payload =
      items.length === 1 ? items[0]!.body : { fromRegion: region, batch: items.map((q) => q.body) };
    let sent: Promise<{ json(): unknown }>;
    try {
      sent = nc.request(subject, JSON.stringify(payload), { timeout: longest * 2 + 100 });
    } catch (error) {
      for (const q of items) q.settle({ ok: false, error });
      return;
    }
    sent.then(
      (msg) => {
        let raw: unknown;
        try {
          raw = msg.json();
        } catch (error) {
          for (const q of items) q.settle({ ok: false, error });
          return;
        }
        if (items.length === 1) {
          items[0]!.settle({ ok: true, raw });
          return;
        }
        // An error answer to the whole batch (or a malformed one) is each decision's answer.
        const parsed = ForwardedBatchReply.safeParse(raw);
        if (!parsed.success || 'error' in parsed.data || parsed.data.replies.length !== items.length) {
          for (const q of items) q.settle({ ok: true, raw });
          return;
        }
        const { replies } = parsed.data;
        items.forEach((q, i) => q.settle({ ok: true, raw: replies[i] }));
      },
      (error: unknown) => {
        for (const q of items) q.settle({ ok: false, error });
      },
    );
  }

  #overloaded(home: string, path: ShedPath): void {
    this.#decisions?.inc({ home, outcome: 'overloaded' });
    this.#shed?.inc({ home, path });
  }

  #fail(home: string, outcome: ForwardOutcome, message: string, cause?: unknown): never {
    this.#decisions?.inc({ home, outcome });
    throw new HomeUnreachableError(outcome, message, cause === undefined ? undefined : { cause });
  }
}
