/**
 * The home side of strict mode: this agent joins its region's queue group and decides the checks other regions
 * forward, on its own Redis, as it decides local ones (same buckets, same idempotency records). Every request is
 * schema-checked; a bad one gets an error answer and changes nothing.
 */
import type { NatsConnection, Subscription } from '@nats-io/nats-core';
import { Counter, type Registry } from 'prom-client';
import { DEFAULT_KV_NAMESPACE } from '../../core/wire/kv.js';
import {
  ForwardedBatch,
  ForwardedDecision,
  HOME_SHED_WORDS,
  homeShedOf,
  strictSubject,
  type HomeShed,
  type ForwardErrorCode,
  type ForwardedBatchReply,
  type ForwardedReply,
} from '../../core/wire/strict.js';

/** Decides a forwarded request at home: results, or an error code with a message. */
export type ForwardedDecider = (request: ForwardedDecision) => Promise<ForwardedReply>;

export interface StrictResponderOptions {
  nc: NatsConnection;
  region: string;
  namespace?: string;
  decide: ForwardedDecider;
  /**
   * Admission control: a function to call once the request is answered, or a reason to shed it. A shed request
   * is answered `overloaded` at once, so the requester hears "busy" rather than waiting out its deadline.
   */
  admit?: () => (() => void) | string;
  /**
   * Whether a region is one this agent has seen in the allocation records: any other name a request carries is
   * counted under the label `other`, so a sender cannot mint metric series. Absent: every name is its own label.
   */
  knownRegion?: (region: string) => boolean;
  registry?: Registry;
  log?: { warn(obj: object, msg?: string): void };
}

export class StrictResponder {
  readonly #options: StrictResponderOptions;
  readonly #answered: Counter<'from' | 'outcome'> | undefined;
  readonly #shed: Counter<'from' | 'path'> | undefined;
  #subscription: Subscription | undefined;
  #inFlight = new Set<Promise<void>>();

  constructor(options: StrictResponderOptions) {
    this.#options = options;
    if (options.registry !== undefined) {
      this.#answered = new Counter({
        name: 'quotaplane_strict_requests_total',
        help: 'Strict-mode decisions this home agent answered for other regions, by origin and outcome.',
        labelNames: ['from', 'outcome'],
        registers: [options.registry],
      });
      this.#shed = new Counter({
        name: 'quotaplane_strict_shed_total',
        help: 'Strict-mode decisions this home agent answered `overloaded` (charging nothing), by origin and path: late (taken up after the deadline they carried), admission (admission control), store_deadline (the store call could not run before the deadline).',
        labelNames: ['from', 'path'],
        registers: [options.registry],
      });
    }
  }

  start(): void {
    const { subject, queue } = strictSubject(
      this.#options.namespace ?? DEFAULT_KV_NAMESPACE,
      this.#options.region,
    );
    this.#subscription = this.#options.nc.subscribe(subject, {
      queue,
      callback: (error, msg) => {
        if (error !== null) return;
        const work = this.#handle(msg.data, (reply) => {
          if (msg.reply !== undefined && msg.reply !== '') msg.respond(JSON.stringify(reply));
        });
        this.#inFlight.add(work);
        void work.finally(() => this.#inFlight.delete(work));
      },
    });
  }

  /** Leave the queue group (other home agents take over) and finish the requests already taken. */
  async stop(): Promise<void> {
    this.#subscription?.unsubscribe();
    this.#subscription = undefined;
    await Promise.allSettled([...this.#inFlight]);
  }

  async #handle(
    data: Uint8Array,
    respond: (reply: ForwardedReply | ForwardedBatchReply) => void,
  ): Promise<void> {
    let value: unknown;
    try {
      value = JSON.parse(new TextDecoder().decode(data));
    } catch {
      value = undefined;
    }
    // A batch (the checks one agent forwarded here within one turn of its event loop): each decision is decided
    // on its own, as if it had come alone, and the answers go back together, in order.
    if (typeof value === 'object' && value !== null && Object.hasOwn(value, 'batch')) {
      const batch = ForwardedBatch.safeParse(value);
      if (!batch.success) {
        this.#answered?.inc({ from: 'unknown', outcome: 'invalid_request' });
        respond(error('invalid_request', issues(batch.error.issues)));
        return;
      }
      const replies = await Promise.all(batch.data.batch.map((request) => this.#decideOne(request)));
      respond({ replies });
      return;
    }
    const parsed = ForwardedDecision.safeParse(value);
    if (!parsed.success) {
      this.#answered?.inc({ from: 'unknown', outcome: 'invalid_request' });
      respond(error('invalid_request', issues(parsed.error.issues)));
      return;
    }
    respond(await this.#decideOne(parsed.data));
  }

  async #decideOne(request: ForwardedDecision): Promise<ForwardedReply> {
    // A home never forwards to itself: a request naming this region as its origin is not an agent's.
    if (request.fromRegion === this.#options.region) {
      this.#answered?.inc({ from: 'other', outcome: 'invalid_request' });
      return error('invalid_request', `fromRegion ${request.fromRegion} is this home region`);
    }
    const from = (this.#options.knownRegion?.(request.fromRegion) ?? true) ? request.fromRegion : 'other';
    // A request taken up before its caller's deadline is decided: it waits here, within that deadline, and its
    // store call carries the deadline into the script, so it charges before it or not at all (then it is
    // answered `overloaded`). Only one whose deadline has already passed is shed at once.
    const now = Date.now();
    if (request.deadlineAtMs !== undefined && now >= request.deadlineAtMs) {
      this.#overloaded(from, 'late');
      return error('overloaded', `${HOME_SHED_WORDS.late} (${now - request.deadlineAtMs} ms after it)`);
    }
    const admitted = this.#options.admit?.() ?? (() => undefined);
    if (typeof admitted === 'string') {
      this.#overloaded(from, 'admission');
      return error('overloaded', `${HOME_SHED_WORDS.admission} (${admitted.replace(/_/g, ' ')})`);
    }
    try {
      const reply = await this.#options.decide(request);
      if ('error' in reply && reply.error === 'overloaded') this.#overloaded(from, homeShedOf(reply.message));
      else this.#answered?.inc({ from, outcome: 'error' in reply ? reply.error : 'ok' });
      return reply;
    } catch (err) {
      this.#answered?.inc({ from, outcome: 'failed' });
      this.#options.log?.warn({ err }, 'strict responder: deciding a forwarded request failed');
      return error('failed', 'the home region could not decide');
    } finally {
      admitted();
    }
  }

  #overloaded(from: string, path: HomeShed | undefined): void {
    this.#answered?.inc({ from, outcome: 'overloaded' });
    this.#shed?.inc({ from, path: path ?? 'other' });
  }
}

function issues(list: readonly { path: readonly PropertyKey[]; message: string }[]): string {
  return list.map((i) => `${i.path.map(String).join('.')}: ${i.message}`).join('; ');
}

function error(code: ForwardErrorCode, message: string): ForwardedReply {
  return { error: code, message: message.slice(0, 300) };
}
