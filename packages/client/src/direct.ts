/**
 * Direct decisions (docs/agent.md, "Direct decisions"): a service trusted with its region's Redis decides a
 * policy's single checks in its own process, with the agent's own bucket script on the agent's own bucket keys,
 * under a short **term** the agent gives (`POST /v1/terms`, core/wire/term.ts). The agent stays the one place
 * that sizes buckets: a term carries the bucket its region enforces now (the share, its rate-history floor), the
 * script's SHA, and how long it holds; the agent counts the term as a decision in flight until it lapses, so it
 * acknowledges a shrink of its share only once no client can still decide with the old one.
 *
 * What this process keeps to:
 * - A term is used only until `validForMs` after the request for it was *sent* (this process's monotonic clock),
 *   and every script call carries the term's `deadlineMicros` (Redis time): a call that reaches Redis later
 *   changes nothing (the script answers {-1}) and the check goes to the agent.
 * - Only single checks with no class, no dry run and no idempotency key, of a whole cost the term allows, for a
 *   valid subject the term does not exclude, are decided here; subjects are keyed as the agent keys them (hashed
 *   with its HMAC secret when the term names the secret's fingerprint and this process holds the same secret). Everything else, and
 *   every check while no term is held, goes to the agent as before.
 * - A refusal is the answer only when the term says refusals are final; otherwise (the policy borrows from other
 *   regions) the refused check goes to the agent, which may cover it.
 * - A final refusal is remembered until its retry-after, measured from when its call was sent: while the term's
 *   bucket stays the same, a bucket that could not pay a cost cannot pay it any sooner (other callers only take
 *   tokens; a floor only slows refill), so later checks of that subject for the same cost are refused here without
 *   a call, told the retry-after the script gave, counted down. Only a refund, or another caller deciding with a
 *   grown share, within it could have made a token come sooner (a refusal that would not have been, never an
 *   admission that should not). The grant pool's denial cache (grants.ts) keeps the same rule on the agent path;
 *   this one also remembers `share_exhausted` (the term's bucket is the share) and times from the call's send.
 * - A script call that fails (no connection, a timeout, an error) sends its checks to the agent: a failure here
 *   never becomes an answer. A timed-out call may still run in Redis before its deadline, charging a token the
 *   agent then charges again: fewer admissions, never more. Three failed calls in a row pause direct decisions
 *   for a second.
 * - What the terms decided is reported with each renewal (admitted and refused tokens per subject), so the
 *   coordinator sees this process's demand as it sees the agent's.
 *
 * Decisions of one event-loop turn leave as one script call (up to `maxBatch`), as the agent's own store sends
 * them; at most `callsInFlight` calls are on the wire at once, later ones wait and leave together.
 */
import { onlySingleDecisionKeys, type DecisionRequest } from '../../../core/wire/agent.js';
import {
  MAX_REQUESTS_PER_CALL,
  decodeReply,
  encodeRequest,
  parseReplies,
  scriptCall,
} from '../../../core/wire/bucket.js';
import { DeadlinePassedError } from '../../../core/wire/script.js';
import { parseRefundReply, refundArguments } from '../../../core/wire/refund.js';
import { bucketKey } from '../../../core/keys.js';
import { normalizeSubject } from '../../../core/subjects/subject.js';
import { rateLimitHeaders } from '../../../core/wire/rate-limit-headers.js';
import {
  MAX_TERM_USAGE,
  TermResponse,
  termKeyFingerprint,
  type TermRequest,
  type TermUsage,
} from '../../../core/wire/term.js';
import {
  MICRO,
  type EncodedCheck,
  type EncodedReply,
  type EncodedRequest,
} from '../../../core/models/token-bucket.js';
import type { ClientCheckResult, Decision } from './agent-client.js';
import { DENIAL_RECHECK_MS } from './grants.js';

/**
 * What direct decisions need of a Redis client: ioredis's `evalsha` and `eval` (an `ioredis` `Redis` on the
 * region's Redis, the one its agent decides on, fits as it is). Not a Redis Cluster: a term's checks of one turn
 * travel in one script call, which a cluster could not take across slots.
 */
export interface DirectRedis {
  evalsha(sha: string, numKeys: number, ...args: string[]): Promise<unknown>;
  eval(script: string, numKeys: number, ...args: string[]): Promise<unknown>;
}

/** How the client decides directly. */
export interface DirectOptions {
  /** A client of the region's Redis (the agent's own; see docs/agent.md on the trust this takes). */
  redis: DirectRedis;
  /** Longest wait for a script call's answer, ms; a call not answered by then sends its checks to the agent. Default 100. */
  timeoutMs?: number;
  /** Most requests in one script call, 1..256 (a check, and a take ahead riding with one; a first check with its take may make 2). Default 64. */
  maxBatch?: number;
  /** Most script calls on the wire at once. Default 4. */
  callsInFlight?: number;
  /**
   * The agent's subject HMAC secret (`QP_HMAC_SECRET`), when it keys subjects with one: each subject is hashed here
   * as the agent hashes it. A term names the secret's fingerprint; without the same secret its policy is decided
   * at the agent (counted in `terms.notAllowed`).
   */
  hmacSecret?: string;
  /**
   * Tokens taken ahead for a subject this process checks often (`false`: never). The script request that decides
   * such a subject's check also takes, in the same bucket operation (all or nothing; a bucket short of both sends
   * the check again alone), what the subject's pace here spends over half of `horizonMs` (its pace read as the
   * slower of its average and its last interval; at most a tenth of the term's bucket; only from a bucket that stays
   * at least half full; at least 2 tokens); its later checks spend those tokens here with no call, while the term's
   * bucket stays the same, for four fifths of `horizonMs` from the take.
   * Tokens not spent by then (or when the bucket changes, the pace is forgotten, or the client closes) are handed
   * back to the bucket with the term's refund script (lua/refund.lua), by the end of the horizon in Redis time (a
   * hand-back that runs later changes nothing): never past the lower of the bucket's capacity then and now. Only
   * under a term that names that script. `horizonMs` is from 500 (the last fifth, for handing back, then holds two
   * sweeps) to 10,000. Default `{ horizonMs: 5000 }`.
   */
  grants?: { horizonMs?: number } | false;
}

/** Why a check was sent to the agent instead of decided here. */
export type DirectMiss = 'no_term' | 'not_direct' | 'refused' | 'failed' | 'late';
export const DIRECT_MISSES: readonly DirectMiss[] = ['no_term', 'not_direct', 'refused', 'failed', 'late'];

/** What direct decisions did since the client was made. */
export interface DirectStats {
  /** Checks decided here: admitted and refused. */
  admitted: number;
  refused: number;
  /** Of `refused`, those answered from a remembered refusal, with no script call (until its retry-after). */
  recalled: number;
  /** Checks of a policy with terms sent to the agent, by why (`not_direct`: a class, a cost, an excluded subject…). */
  toAgent: Record<DirectMiss, number>;
  /**
   * Terms taken, refused by the agent (the policy gives none: it is asked again after a minute), and failed; and
   * usage reports dropped (`usageDropped`): refused as more than one term admits, as after a policy was lowered,
   * the term was asked again at once without them.
   */
  terms: { taken: number; notAllowed: number; failed: number; usageDropped: number };
  /** Script calls made, and how many failed (the checks went to the agent). */
  calls: number;
  callsFailed: number;
  /** Subjects whose pace this process keeps now, every policy (at most 65,536 a policy; quiet ones are forgotten). */
  paced: number;
  /**
   * Tokens taken ahead (`DirectOptions.grants`): takes that got tokens, the tokens they took, the checks admitted
   * on them with no call (counted in `admitted` too; a check of cost 3 spends 3 tokens). Tokens not spent (run
   * out, a new bucket, a forgotten pace, a closed client) are handed back: `returned` the bucket took back,
   * `dropped` it did not (it had refilled to its capacity meanwhile, or its key expired; or the hand-back failed,
   * came past the horizon, or overflowed its queue), both to the micro-token (a bucket refilling meanwhile takes
   * back part of a token). `returnCalls` counts the hand-back script calls, `returnsFailed` those that failed or
   * ran past their deadline. `short` counts takes the bucket had too few tokens for: their checks went again alone.
   */
  grants: {
    taken: number;
    tokens: number;
    spent: number;
    returned: number;
    dropped: number;
    returnCalls: number;
    returnsFailed: number;
    short: number;
  };
}

/** A decision made here: `local` says so. */
export interface DirectDecision extends Decision {
  local: 'direct';
  /**
   * Admitted on a token taken ahead: how long before this answer (ms, rounded up) the take that paid for it was
   * sent. The token left the bucket between then and the take's answer, so that is when the decision was made.
   */
  aheadMs?: number;
}

/** Sends a term request to the agent: the status, the parsed answer and a problem's code. */
export type TermTransport = (
  body: TermRequest,
) => Promise<{ status: number; json: unknown; code: string | undefined }>;

interface Held {
  term: TermResponse;
  /** Monotonic ms: no call under this term is made from then on. */
  usableUntil: number;
  /** Monotonic ms: `validForMs` after the request was sent, the instant `deadlineMicros` stands for. */
  endsAt: number;
  /** Monotonic ms: the next term is asked for from then on. */
  renewAt: number;
  exclude: ReadonlySet<string>;
  maxCost: number;
  /** Subjects are keyed by their HMAC with the agent's secret (which this process holds too). */
  hashed: boolean;
  /** The term's bucket in the script's units, checked once (a check's own are its key and cost). */
  encoded: EncodedCheck;
  /**
   * The bucket's identity (version, capacity, refill, floor) and its refusals' finality, reason and mode: a
   * remembered refusal holds under the same one.
   */
  bucketId: string;
}

/** A final refusal of one subject, remembered until a token could have come for it. */
interface Refusal {
  /** Monotonic ms: refused here before then (the call's send time + the retry-after, less a millisecond). */
  until: number;
  /** Monotonic ms the retry-after said, from when the answer came: what a caller refused from memory is told. */
  retryAt: number;
  /** The cost refused: a check for the same cost is refused too (its retry-after is this cost's). */
  cost: number;
  /** The bucket it was refused by (`Held.bucketId`). */
  bucketId: string;
  /** Monotonic ms its call was sent, the tokens left then, and when the bucket is full again (null: never). */
  at: number;
  remaining: number;
  fullAt: number | null;
  reason: 'cost_exceeds_share' | NonNullable<ClientCheckResult['reason']>;
}

/** One subject's pace in this process, and the tokens taken ahead for it. */
interface Pace {
  /**
   * Monotonic ms of the subject's last check here, and the running average of the time between its checks (0: no
   * pace yet, or the subject was quiet for a whole horizon).
   */
  last: number;
  intervalMs: number;
  /** The time between its last two checks here, ms (0: none yet). */
  sinceMs: number;
  /** Tokens the bucket had left at the last answer here (a take asks for at most half of them). */
  bucketLeft: number;
  /** Tokens taken ahead and not spent: spent here before `until` (monotonic ms) while the bucket is `bucketId`. */
  tokens: number;
  until: number;
  /** Monotonic ms the take that holds them was sent. */
  takenAt: number;
  bucketId: string;
  /** Where and until when they are handed back (its `tokens` unused: the pace's own count is what is left). */
  returnTo: HandBack | undefined;
  /** The take's answer: the tokens the bucket had left after it, and when the bucket is full again (null: never). */
  left: number;
  fullAt: number | null;
  /** A take is on the wire. */
  taking: boolean;
  /** Checks of the subject waiting for a call (a burst behind a take is admitted on it when it answers). */
  queued: number;
}

interface PolicyState {
  held: Held | undefined;
  renewing: boolean;
  /** Monotonic ms before which no term is asked for (after a refusal or a failure). */
  notBefore: number;
  failures: number;
  /** The agent said it gives no terms for this policy (its checks are not direct until a term comes). */
  noTerms: boolean;
  /** Admitted and refused tokens per subject since the last renewal. */
  usage: Map<string, [number, number]>;
  /** Final refusals by keyed subject and cost, each until its retry-after (at most MAX_REMEMBERED; dropped when run out). */
  refusals: Map<string, Refusal>;
  /** Paces by keyed subject (at most MAX_PACED; forgotten once quiet for a horizon). */
  paces: Map<string, Pace>;
  /** Where the renewals' walk of `paces` goes on from (a live iterator; undefined: from the start). */
  walk: Iterator<[string, Pace]> | undefined;
}

/** Tokens taken ahead and not spent, on their way back to their bucket (lua/refund.lua). */
interface HandBack {
  sha: string;
  key: string;
  /** Micro-tokens: the bucket's capacity when they were taken (a refund never fills past it). */
  capacity: number;
  tokens: number;
  /** The end of the take's horizon: monotonic ms (not sent later) and Redis TIME µs (changes nothing later). */
  by: number;
  deadline: number;
}

interface Waiting {
  held: Held;
  subject: string;
  /** The subject as keyed (hashed when the agent hashes). */
  keyed: string;
  request: EncodedRequest;
  /** The subject's pace, and the tokens this call also takes ahead for it (0: none). */
  pace: Pace | undefined;
  spare: number;
  resolve: (decision: DirectDecision | undefined) => void;
}

/** Most bytes of usage one renewal carries, at first: well within the agent's default body limit for terms (256 KiB). */
const USAGE_BYTES = 65_536;
/** Most policies decided directly by one client. */
const MAX_POLICIES = 256;
/** Most subjects whose usage one policy counts between renewals (the rest of a flood goes uncounted). */
const MAX_COUNTED_SUBJECTS = 16_384;
/** Most refusals one policy remembers at once (past this, it forgets them all and starts again). */
const MAX_REMEMBERED = 16_384;
/** Answers that mean no term will come for the policy from this agent for a while. */
const NO_TERMS = new Set(['AGT_ERR_TERM_NOT_ALLOWED', 'AGT_ERR_TERMS_OFF', 'AGT_ERR_UNKNOWN_POLICY']);
/** Asked for again this long after the agent refused terms for a policy, ms. */
const NOT_ALLOWED_RETRY_MS = 60_000;
/** First wait after a failed term request, ms; doubles to FAILED_RETRY_MAX_MS. */
const FAILED_RETRY_MS = 250;
const FAILED_RETRY_MAX_MS = 10_000;
/** A term is given up this long before it runs out: a call made then still reaches Redis well before its deadline. */
const USE_MARGIN_MS = 20;
/** Failed script calls in a row that pause direct decisions, and for how long, ms. */
const PAUSE_AFTER_FAILURES = 3;
const PAUSE_MS = 1000;
/**
 * Tokens taken ahead: the default horizon, its longest (ms; the shortest is MIN_GRANT_HORIZON_MS, below), the fewest
 * worth a take, and a take's cap (a tenth).
 */
const GRANT_HORIZON_MS = 5000;
const MAX_GRANT_HORIZON_MS = 10_000;
const MIN_GRANT = 2;
const GRANT_SHARE = 10;
/**
 * Most subjects whose pace one policy keeps (about 100 bytes each). A pace quiet for a horizon holds nothing and
 * says nothing (its tokens ran out, its next check starts a new pace): such paces are forgotten by the renewals'
 * walk, and when the table is full; only a table full of subjects active within the horizon starts again empty,
 * dropping their tokens.
 */
const MAX_PACED = 65_536;
/** Buckets one hand-back call carries (lua/refund.lua takes 1..16), calls on the wire at once, and most queued. */
const RETURN_BUCKETS = 16;
/**
 * Paces each renewal looks at, going on from where the last stopped: a walk of every pace at once (10,000 subjects
 * of a uniform load) held the event loop for milliseconds at each renewal, long enough to set the p99 of a busy
 * service. A quiet pace is forgotten a few renewals later instead; tokens run out are handed back by the sweep.
 */
const PACES_PER_RENEWAL = 2_048;
const RETURN_CALLS = 2;
const MAX_RETURNS = 65_536;
/**
 * The part of the horizon kept for handing back: tokens are spent for the rest of it (4 s of 5), then handed back
 * within it, by a sweep every half of this (at least every 50 ms) or by their subject's next check.
 */
const RETURN_SHARE = 5;
const MIN_SWEEP_MS = 50;
/**
 * The shortest horizon (500 ms): its last fifth, the time left to hand tokens back in, holds two sweeps at their
 * shortest interval. A shorter window would mostly fall between two sweeps, and a quiet subject's tokens, first
 * looked at past the horizon, would be dropped instead of handed back.
 */
const MIN_GRANT_HORIZON_MS = 2 * MIN_SWEEP_MS * RETURN_SHARE;

export class DirectDecider {
  readonly #send: TermTransport;
  readonly #redis: DirectRedis;
  readonly #timeoutMs: number;
  readonly #maxBatch: number;
  readonly #callsInFlight: number;
  readonly #now: () => number;
  readonly #hmacSecret: string | undefined;
  /** How long tokens taken ahead are spent, ms (0: none are taken). */
  readonly #horizonMs: number;
  readonly #policies = new Map<string, PolicyState>();
  /** Sources of the scripts by SHA, once an agent sent one. */
  readonly #sources = new Map<string, string>();
  #waiting: Waiting[] = [];
  #onTheWire = 0;
  #flushScheduled = false;
  #failuresInARow = 0;
  /** Redis lacks a script whose source this process does not have: the next term request asks for it. */
  #needSource = false;
  /** Most bytes of usage one renewal carries (halved when the agent finds a body too large). */
  #usageBytes = USAGE_BYTES;
  #pausedUntil = 0;
  #closed = false;
  /** Tokens taken ahead and not spent, waiting to be handed back; hand-back calls on the wire. */
  #returns: HandBack[] = [];
  #returnsOnTheWire = 0;
  #returnScheduled = false;
  /** What close() gave: settles once no call or hand-back is left on the wire. */
  #closing: Promise<void> | undefined;
  #drained: (() => void) | undefined;
  /** Paces holding tokens taken ahead, and what hands back theirs once their spending time ran out (while any are). */
  readonly #holding = new Set<Pace>();
  #sweeper: NodeJS.Timeout | undefined;
  readonly #stats: Omit<DirectStats, 'paced'> = {
    admitted: 0,
    refused: 0,
    recalled: 0,
    toAgent: { no_term: 0, not_direct: 0, refused: 0, failed: 0, late: 0 },
    terms: { taken: 0, notAllowed: 0, failed: 0, usageDropped: 0 },
    calls: 0,
    callsFailed: 0,
    // `returned` and `dropped` in micro-tokens here (whole), in tokens in stats().
    grants: {
      taken: 0,
      tokens: 0,
      spent: 0,
      returned: 0,
      dropped: 0,
      returnCalls: 0,
      returnsFailed: 0,
      short: 0,
    },
  };

  /** `now`: monotonic ms (tests pass their own clock). */
  constructor(send: TermTransport, options: DirectOptions, now: () => number = () => performance.now()) {
    this.#send = send;
    this.#redis = options.redis;
    this.#timeoutMs = options.timeoutMs ?? 100;
    this.#maxBatch = options.maxBatch ?? 64;
    this.#callsInFlight = options.callsInFlight ?? 4;
    this.#now = now;
    this.#hmacSecret = options.hmacSecret;
    this.#horizonMs = options.grants === false ? 0 : (options.grants?.horizonMs ?? GRANT_HORIZON_MS);
    if (typeof this.#redis?.evalsha !== 'function' || typeof this.#redis.eval !== 'function')
      throw new TypeError('direct: redis must be a Redis client with evalsha and eval (an ioredis Redis)');
    if (!(this.#timeoutMs > 0 && this.#timeoutMs <= 10_000))
      throw new TypeError('direct: timeoutMs must be > 0 and <= 10000');
    if (!(Number.isInteger(this.#maxBatch) && this.#maxBatch >= 1 && this.#maxBatch <= MAX_REQUESTS_PER_CALL))
      throw new TypeError(`direct: maxBatch must be an integer from 1 to ${MAX_REQUESTS_PER_CALL}`);
    if (!(Number.isInteger(this.#callsInFlight) && this.#callsInFlight >= 1))
      throw new TypeError('direct: callsInFlight must be an integer >= 1');
    if (
      options.grants !== false &&
      !(
        Number.isInteger(this.#horizonMs) &&
        this.#horizonMs >= MIN_GRANT_HORIZON_MS &&
        this.#horizonMs <= MAX_GRANT_HORIZON_MS
      )
    )
      throw new TypeError(
        `direct: grants.horizonMs must be an integer from ${MIN_GRANT_HORIZON_MS} to ${MAX_GRANT_HORIZON_MS}`,
      );
  }

  stats(): DirectStats {
    return {
      ...this.#stats,
      paced: [...this.#policies.values()].reduce((n, state) => n + state.paces.size, 0),
      toAgent: { ...this.#stats.toAgent },
      terms: { ...this.#stats.terms },
      grants: {
        ...this.#stats.grants,
        returned: this.#stats.grants.returned / MICRO,
        dropped: this.#stats.grants.dropped / MICRO,
      },
    };
  }

  /**
   * Decide `body` here, or undefined at once (ask the agent). A decision made with no call (tokens held, a refusal
   * remembered) comes as it is; one that needs a script call comes as a promise, which answers undefined when the
   * check turned out to need the agent (a failed call, a refusal that is not final, a term that ran out meanwhile).
   */
  decide(body: DecisionRequest): DirectDecision | Promise<DirectDecision | undefined> | undefined {
    // A policy, subject or cost of another type than the wire's (a caller's own input passed on unchecked) is the
    // agent's to refuse with its 400. Here a subject that is not a string would throw as it is keyed, a null cost
    // would be decided as a cost of 1, and a policy name that is not a string would take a policy's place.
    if (this.#closed || 'checks' in body || typeof body.policy !== 'string') return undefined;
    if (
      body.class !== undefined ||
      (body.dryRun !== undefined && body.dryRun !== false) ||
      body.idempotencyKey !== undefined ||
      typeof body.subject !== 'string' ||
      (body.cost !== undefined && typeof body.cost !== 'number') ||
      !onlySingleDecisionKeys(body)
    ) {
      if (this.#policies.has(body.policy)) this.#stats.toAgent.not_direct++;
      return undefined;
    }
    const now = this.#now();
    const state = this.#state(body.policy);
    if (state === undefined) return undefined;
    const held = state.held;
    if (held === undefined || now >= held.usableUntil) {
      this.#renew(body.policy, state, now);
      // A policy the agent gives no terms for is not direct at all; otherwise its term is on its way.
      this.#stats.toAgent[state.noTerms ? 'not_direct' : 'no_term']++;
      return undefined;
    }
    if (now >= held.renewAt) this.#renew(body.policy, state, now);
    const cost = body.cost ?? 1;
    const subject = this.#keyed(held, body.subject);
    if (
      !(Number.isInteger(cost) && cost >= 1 && cost <= held.maxCost) ||
      subject === undefined ||
      held.exclude.has(body.subject) ||
      held.exclude.has(subject)
    ) {
      this.#stats.toAgent.not_direct++;
      return undefined;
    }
    const pace = this.#horizonMs > 0 ? this.#pace(state, held, subject, now) : undefined;
    // Taken ahead from this very bucket, which the term still holds in force: spent here, no call.
    if (pace !== undefined && pace.tokens >= cost)
      return this.#spend(state, held, body.subject, pace, cost, now);
    if (now < this.#pausedUntil) {
      this.#stats.toAgent.failed++;
      return undefined;
    }
    const memoryKey = refusalKey(subject, cost);
    const remembered = state.refusals.get(memoryKey);
    if (remembered !== undefined) {
      if (now < remembered.until && remembered.bucketId === held.bucketId)
        return this.#recall(state, held, body.subject, remembered, cost, now);
      if (now >= remembered.until) state.refusals.delete(memoryKey);
    }
    const { term } = held;
    const key = bucketKey(term.version, subject, term.policy);
    const request: EncodedRequest = {
      keys: [key],
      checks: [{ ...held.encoded, cost: cost * MICRO }],
      dryRun: false,
    };
    const spare = pace === undefined ? 0 : this.#spare(held, pace, cost);
    if (spare > 0) pace!.taking = true;
    if (pace !== undefined) pace.queued++;
    return new Promise((resolve) =>
      this.#enqueue({ held, subject: body.subject, keyed: subject, request, pace, spare, resolve }),
    );
  }

  /** Queue a check for a script call; the queue leaves at the end of the turn. */
  #enqueue(w: Waiting): void {
    this.#waiting.push(w);
    if (!this.#flushScheduled) {
      this.#flushScheduled = true;
      setImmediate(this.#flush);
    }
  }

  /**
   * The subject's pace, counting this check; tokens taken ahead that may no longer be spent (run out, or taken from
   * a bucket the term no longer holds) are handed back.
   */
  #pace(state: PolicyState, held: Held, subject: string, now: number): Pace {
    let pace = state.paces.get(subject);
    if (pace === undefined) {
      if (state.paces.size >= MAX_PACED) this.#forgetIdle(state, now);
      if (state.paces.size >= MAX_PACED) this.#forgetPaces(state);
      pace = {
        last: now,
        intervalMs: 0,
        sinceMs: 0,
        bucketLeft: 0,
        tokens: 0,
        until: 0,
        takenAt: 0,
        bucketId: '',
        returnTo: undefined,
        left: 0,
        fullAt: null,
        taking: false,
        queued: 0,
      };
      state.paces.set(subject, pace);
      return pace;
    }
    const since = now - pace.last;
    pace.sinceMs = since;
    // A subject quiet for a whole horizon starts a new pace: its old one says nothing of what comes now.
    if (since >= this.#horizonMs) pace.intervalMs = 0;
    // (A first interval of 0, checks in one millisecond, counts as a tenth of one: a pace, at most a tenth of the bucket.)
    else
      pace.intervalMs = pace.intervalMs === 0 ? Math.max(0.1, since) : 0.75 * pace.intervalMs + 0.25 * since;
    pace.last = now;
    if (pace.tokens > 0 && (now >= pace.until || pace.bucketId !== held.bucketId)) this.#giveBack(pace);
    return pace;
  }

  /** A check admitted on tokens its subject holds (taken ahead from `held`'s bucket, enough for `cost`). */
  #spend(
    state: PolicyState,
    held: Held,
    subject: string,
    pace: Pace,
    cost: number,
    now: number,
  ): DirectDecision {
    pace.tokens -= cost;
    if (pace.tokens === 0) this.#holding.delete(pace);
    this.#stats.grants.spent++;
    const resetMs = pace.fullAt === null ? null : Math.max(0, Math.ceil(pace.fullAt - now));
    const decision = this.#decision(
      state,
      held,
      subject,
      true,
      cost,
      pace.left + pace.tokens,
      resetMs,
      0,
      undefined,
    );
    decision.aheadMs = Math.max(0, Math.ceil(now - pace.takenAt));
    return decision;
  }

  /**
   * Tokens to take ahead with this check: what the subject's pace here (the slower of its average and its last
   * interval) spends over half the horizon, at most a tenth of the bucket, and only what leaves the bucket at least
   * half full after this check; none below MIN_GRANT, while some are held or a take is on the wire.
   */
  #spare(held: Held, pace: Pace, cost: number): number {
    // Only under a term that says how to hand back what is not spent.
    if (pace.taking || pace.tokens > 0 || pace.intervalMs <= 0 || held.term.refundSha === undefined) return 0;
    const n = Math.min(
      Math.floor(held.term.bucket.capacity / GRANT_SHARE),
      Math.floor(this.#horizonMs / 2 / Math.max(pace.intervalMs, pace.sinceMs)),
      // Only from a bucket that stays at least half full: a token lost (not handed back) then costs no admission
      // until the subject has spent the other half, which it spends with no take at all.
      Math.floor(pace.bucketLeft - cost - held.term.bucket.capacity / 2),
    );
    return n >= MIN_GRANT ? n : 0;
  }

  /** Hand back tokens whose spending time ran out; forget paces quiet for a horizon with no take on the wire. */
  #forgetIdle(state: PolicyState, now: number): void {
    for (const [subject, pace] of state.paces) this.#tidy(state, subject, pace, now);
  }

  /** Hand back what a pace holds past its spending time; forget it once quiet for a horizon, no take on the wire. */
  #tidy(state: PolicyState, subject: string, pace: Pace, now: number): void {
    if (pace.tokens > 0 && now >= pace.until) this.#giveBack(pace);
    if (pace.tokens === 0 && !pace.taking && now - pace.last >= this.#horizonMs) state.paces.delete(subject);
  }

  /** The next PACES_PER_RENEWAL paces of the renewals' walk, as #forgetIdle (the walk starts again once done). */
  #forgetSome(state: PolicyState, now: number): void {
    const walk = state.walk ?? state.paces.entries();
    for (let i = 0; i < PACES_PER_RENEWAL; i++) {
      const next = walk.next();
      if (next.done === true) {
        state.walk = undefined;
        return;
      }
      this.#tidy(state, next.value[0], next.value[1], now);
    }
    state.walk = walk;
  }

  /** Forget every pace (a flood of subjects): the tokens they held are handed back. */
  #forgetPaces(state: PolicyState): void {
    for (const pace of state.paces.values()) this.#giveBack(pace);
    state.paces.clear();
  }

  /** Hand back the tokens a pace holds unspent. */
  #giveBack(pace: Pace): void {
    if (pace.tokens > 0) this.#handBack({ ...pace.returnTo!, tokens: pace.tokens });
    pace.tokens = 0;
    this.#holding.delete(pace);
  }

  /** Queue tokens to hand back; they leave together at the end of the turn. */
  #handBack(back: HandBack): void {
    if (this.#returns.length >= MAX_RETURNS) {
      this.#stats.grants.dropped += back.tokens * MICRO;
      return;
    }
    this.#returns.push(back);
    if (!this.#returnScheduled) {
      this.#returnScheduled = true;
      setImmediate(this.#sendReturns);
    }
  }

  readonly #sendReturns = (): void => {
    this.#returnScheduled = false;
    while (this.#returns.length > 0 && this.#returnsOnTheWire < RETURN_CALLS) {
      const now = this.#now();
      const sha = this.#returns[0]!.sha;
      const chunk: HandBack[] = [];
      const rest: HandBack[] = [];
      for (const back of this.#returns) {
        // Only within the take's horizon: later, the bucket may have refilled to its capacity since the take and
        // been spent below it again, and tokens handed back then would be more than it would hold had they never
        // left. (The refund script's deadline keeps to the same end in Redis, for a call that runs late.)
        if (now >= back.by) this.#stats.grants.dropped += back.tokens * MICRO;
        else (chunk.length < RETURN_BUCKETS && back.sha === sha ? chunk : rest).push(back);
      }
      this.#returns = rest;
      if (chunk.length === 0) continue;
      this.#returnsOnTheWire++;
      void this.#return(sha, chunk).finally(() => {
        this.#returnsOnTheWire--;
        if (this.#returns.length > 0) this.#sendReturns();
        else this.#settleClose();
      });
    }
    this.#settleClose();
  };

  /**
   * One refund call (lua/refund.lua, no idempotency record), by the earliest deadline among its buckets: each gets
   * back at most its tokens, never past the lower of its capacity now and at the take. What it did not take back
   * (a full or expired bucket, a failed or late call) is dropped: fewer admissions, never more. A call given up on
   * may still run, by its deadline; it is never sent twice.
   */
  async #return(sha: string, chunk: readonly HandBack[]): Promise<void> {
    const { keys, argv } = refundArguments({
      keys: chunk.map((b) => b.key),
      checks: chunk.map((b) => ({ cost: b.tokens * MICRO, capacity: b.capacity })),
      deadline: Math.min(...chunk.map((b) => b.deadline)),
    });
    const offered = chunk.reduce((n, b) => n + b.tokens * MICRO, 0);
    this.#stats.grants.returnCalls++;
    let given = 0;
    try {
      const reply = parseRefundReply(await this.#run(sha, keys, argv), chunk.length);
      if (reply.late === true) this.#stats.grants.returnsFailed++;
      for (const r of reply.results) given += r.refunded;
    } catch {
      this.#stats.grants.returnsFailed++;
    }
    this.#stats.grants.returned += given;
    this.#stats.grants.dropped += offered - given;
  }

  /** Hand back what ran out of spending time (a subject that went quiet, or slowed down); stops when none is held. */
  readonly #sweep = (): void => {
    const now = this.#now();
    for (const pace of this.#holding) if (now >= pace.until) this.#giveBack(pace);
    if (this.#holding.size === 0) {
      clearInterval(this.#sweeper);
      this.#sweeper = undefined;
    }
  };

  /** Settle what close() gave once nothing is left on the wire. */
  #settleClose(): void {
    if (
      this.#closed &&
      this.#onTheWire === 0 &&
      this.#returns.length === 0 &&
      this.#returnsOnTheWire === 0 &&
      !this.#returnScheduled
    )
      this.#drained?.();
  }

  /**
   * Stop deciding here; checks waiting for a call go to the agent, and no term is asked for again. Tokens taken
   * ahead and not spent are handed back (those of takes still on the wire when they answer): the promise (the same
   * one for every call) settles once no script call or hand-back is left on the wire, so a caller that closes its
   * Redis client too may wait for it first.
   */
  close(): Promise<void> {
    if (this.#closing !== undefined) return this.#closing;
    this.#closed = true;
    clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    this.#closing = new Promise<void>((resolve) => (this.#drained = resolve));
    for (const state of this.#policies.values()) this.#forgetPaces(state);
    for (const w of this.#waiting.splice(0)) w.resolve(undefined);
    // The usage of the last terms is not sent: a closing process's demand is about to be none.
    this.#sendReturns();
    return this.#closing;
  }

  #state(policy: string): PolicyState | undefined {
    let state = this.#policies.get(policy);
    if (state === undefined) {
      // Policy names come from the service's routes; past this many, the rest are decided at the agent.
      if (this.#policies.size >= MAX_POLICIES) return undefined;
      state = {
        held: undefined,
        renewing: false,
        notBefore: 0,
        failures: 0,
        noTerms: false,
        usage: new Map(),
        refusals: new Map(),
        paces: new Map(),
        walk: undefined,
      };
      this.#policies.set(policy, state);
    }
    return state;
  }

  /** Ask for the policy's next term in the background (one at a time, not before `notBefore`). */
  #renew(policy: string, state: PolicyState, now: number): void {
    if (state.renewing || now < state.notBefore || this.#closed) return;
    state.renewing = true;
    const usage = takeUsage(state, this.#usageBytes);
    // Refusals run out are dropped with each renewal, so the memory holds only those still in force.
    for (const [subject, r] of state.refusals) if (r.until <= now) state.refusals.delete(subject);
    // So do paces quiet for a horizon (and tokens taken ahead that ran out), a part of the table at a time.
    this.#forgetSome(state, now);
    const sentAt = now;
    const body: TermRequest = { policy };
    if (usage.length > 0) body.usage = usage;
    // The script's source once per SHA: kept for a Redis that lost its script cache (EVAL instead of EVALSHA).
    if (this.#sources.size === 0 || this.#needSource) body.script = true;
    const attempt = (request: TermRequest): Promise<void> =>
      this.#send(request).then(({ status, json, code }) => {
        if (status === 200) {
          const parsed = TermResponse.safeParse(json);
          if (parsed.success) {
            try {
              this.#hold(state, parsed.data, sentAt);
              return;
            } catch (error) {
              // Another secret keys the agent's subjects: as a policy with no terms. Else a bucket the script
              // would refuse: no term (counted as failed below).
              if (error instanceof KeyMismatch) return this.#noTerms(state);
            }
          }
        }
        // The agent's body limit is below what this process sent: send less usage from now on.
        if (code === 'AGT_ERR_BODY_TOO_LARGE') this.#usageBytes = Math.max(1024, this.#usageBytes / 2);
        // A policy that gives no terms here (or none at all, or an agent with terms off) is asked again later.
        if (code !== undefined && NO_TERMS.has(code)) return this.#noTerms(state);
        // A report refused as more than one term admits: the policy was lowered since the term it covers was
        // sized (every busy client's renewal at once). The term matters more than the report, which is dropped:
        // asked again at once without it, rather than every client's term lapsing together.
        if (code === 'AGT_ERR_INVALID_TERM' && request.usage !== undefined) {
          this.#stats.terms.usageDropped++;
          return attempt({ ...request, usage: undefined });
        }
        this.#failedTerm(state);
      });
    void attempt(body)
      .catch(() => this.#failedTerm(state))
      .finally(() => {
        state.renewing = false;
      });
  }

  /** The subject as the agent keys it (hashed with the agent's secret when the term says so), or undefined. */
  #keyed(held: Held, subject: string): string | undefined {
    const normalized = normalizeSubject(subject, held.hashed ? { hmacSecret: this.#hmacSecret } : {});
    if (!normalized.ok) return undefined;
    return held.hashed || normalized.subject === subject ? normalized.subject : undefined;
  }

  #hold(state: PolicyState, term: TermResponse, sentAt: number): void {
    // Subjects hashed with a secret: only the same secret keys them as the agent does.
    if (
      term.hashed !== undefined &&
      (this.#hmacSecret === undefined || termKeyFingerprint(this.#hmacSecret) !== term.hashed.fingerprint)
    )
      throw new KeyMismatch();
    // The bucket in the script's units, validated once here as every store request is (throws for one the
    // script would refuse: the term then counts as failed).
    const bucket = term.bucket;
    const [encoded] = encodeRequest({
      checks: [
        {
          key: `rl:v${term.version}:{}:${term.policy}`,
          capacity: term.bucket.capacity,
          refillPerSecond: term.bucket.refillPerSecond,
          cost: 1,
          ttlMs: term.bucket.ttlMs,
          ...(term.bucket.floor === undefined ? {} : { floor: term.bucket.floor }),
        },
      ],
    }).checks;
    if (term.script !== undefined) {
      this.#sources.set(term.scriptSha, term.script);
      this.#needSource = false;
    }
    if (term.refundSha !== undefined && term.refundScript !== undefined)
      this.#sources.set(term.refundSha, term.refundScript);
    this.#stats.terms.taken++;
    state.failures = 0;
    state.notBefore = 0;
    state.noTerms = false;
    state.held = {
      term,
      usableUntil: sentAt + term.validForMs - USE_MARGIN_MS,
      endsAt: sentAt + term.validForMs,
      renewAt: sentAt + term.validForMs / 2,
      exclude: new Set(term.exclude),
      maxCost: term.maxCost ?? 1,
      hashed: term.hashed !== undefined,
      encoded: encoded!,
      // Everything a remembered refusal relies on: the bucket, and that its refusals are final with this reason.
      bucketId: `${term.version}:${bucket.capacity}:${bucket.refillPerSecond}:${bucket.floor === undefined ? '' : JSON.stringify(bucket.floor)}:${term.refusals}:${term.refusedReason ?? ''}:${term.mode}`,
    };
  }

  /** No terms for this policy from this agent: asked again after a minute. */
  #noTerms(state: PolicyState): void {
    this.#stats.terms.notAllowed++;
    state.noTerms = true;
    state.held = undefined;
    state.notBefore = this.#now() + NOT_ALLOWED_RETRY_MS;
  }

  /**
   * A term request failed; the next waits a little longer each time. Its usage is not sent again: the agent counts
   * it once the request is valid, term or no term (a 503 too), and a request whose answer was lost may have been
   * counted, so a repeat could count it twice.
   */
  #failedTerm(state: PolicyState): void {
    this.#stats.terms.failed++;
    state.failures++;
    state.notBefore =
      this.#now() + Math.min(FAILED_RETRY_MAX_MS, FAILED_RETRY_MS * 2 ** (state.failures - 1));
  }

  readonly #flush = (): void => {
    this.#flushScheduled = false;
    this.#pump();
  };

  #pump(): void {
    while (this.#waiting.length > 0 && this.#onTheWire < this.#callsInFlight) {
      const now = this.#now();
      const sha = this.#waiting[0]!.held.term.scriptSha;
      const chunk: Waiting[] = [];
      const rest: Waiting[] = [];
      for (const w of this.#waiting) {
        if (now >= w.held.usableUntil) {
          this.#stats.toAgent.late++;
          if (w.pace !== undefined) w.pace.queued--;
          // Only the check that carried the take clears it: another check of the subject may be late meanwhile.
          if (w.spare > 0) w.pace!.taking = false;
          w.resolve(undefined);
        } else if (chunk.length < this.#maxBatch && w.held.term.scriptSha === sha) {
          chunk.push(w);
          if (w.pace !== undefined) w.pace.queued--;
        } else rest.push(w);
      }
      this.#waiting = rest;
      if (chunk.length === 0) continue;
      this.#onTheWire++;
      void this.#call(sha, chunk).finally(() => {
        this.#onTheWire--;
        if (this.#waiting.length > 0) this.#pump();
        else this.#settleClose();
      });
    }
  }

  async #call(sha: string, chunk: readonly Waiting[]): Promise<void> {
    // The call's own deadline too, in Redis time read off the term: its deadline stands for `endsAt`, so an instant
    // t is about deadlineMicros − (endsAt − t). It runs late by at most the term request's round trip (the agent
    // issued the term after this process sent the request), which only matters for a call given up on: one that
    // timed out here may still be charged in Redis within that much, while its check went to the agent (fewer
    // admissions, never more). The term's own deadline stays the bound that keeps the share.
    const sentAt = this.#now();
    const giveUpAt = sentAt + this.#timeoutMs;
    let deadline = Infinity;
    for (const { held } of chunk) {
      const own = redisMicrosAt(held, giveUpAt);
      deadline = Math.min(deadline, held.term.deadlineMicros, Math.max(1, own));
    }
    // A take ahead rides in its check's own request, one bucket operation: the check's cost and the tokens taken,
    // all or nothing. A bucket short of both (fewer tokens than the pace's last sight of it said) sends the check
    // again alone, below.
    const requests = chunk.map((w) =>
      w.spare > 0
        ? {
            ...w.request,
            checks: [{ ...w.request.checks[0]!, cost: w.request.checks[0]!.cost + w.spare * MICRO }],
          }
        : w.request,
    );
    const { keys, argv } = scriptCall(requests, deadline);
    this.#stats.calls++;
    let replies: EncodedReply[];
    try {
      const reply = await this.#run(sha, keys, argv);
      replies = parseReplies(
        reply,
        requests.map(() => 1),
      );
    } catch (error) {
      // A take ahead given up on may still be charged in Redis: tokens dropped, fewer admissions, never more.
      for (const w of chunk) if (w.spare > 0) w.pace!.taking = false;
      const late = error instanceof DeadlinePassedError;
      if (!late) {
        this.#stats.callsFailed++;
        if (++this.#failuresInARow >= PAUSE_AFTER_FAILURES) this.#pausedUntil = this.#now() + PAUSE_MS;
      }
      this.#stats.toAgent[late ? 'late' : 'failed'] += chunk.length;
      for (const w of chunk) w.resolve(undefined);
      return;
    }
    this.#failuresInARow = 0;
    const answeredAt = this.#now();
    chunk.forEach((w, i) => {
      const reply = replies[i]!;
      if (w.spare === 0) {
        const pace = w.pace;
        const cost = w.request.checks[0]!.cost / MICRO;
        // A check its bucket refused while its subject now holds tokens taken ahead (a take earlier in this very
        // call, which Redis ran first, or in a call answered meanwhile) is admitted on them: those tokens left the
        // bucket for this subject's checks, and refusing it while holding them would turn a burst the bucket could
        // pay into refusals (and a remembered one), the tokens handed back later or dropped.
        if (!reply.allowed && pace !== undefined && this.#spendable(pace, w.held, cost, answeredAt)) {
          this.#took(w, reply, undefined, sentAt, answeredAt);
          // What the bucket has left is what this reply says: the call's other checks spent from it after the take.
          seen(pace, reply.results[0]!, answeredAt);
          const state = this.#policies.get(w.held.term.policy)!;
          w.resolve(this.#spend(state, w.held, w.subject, pace, cost, answeredAt));
          return;
        }
        w.resolve(this.#answer(w, reply, sentAt, answeredAt));
        if (pace !== undefined) this.#took(w, reply, undefined, sentAt, answeredAt);
      } else if (reply.allowed) {
        // The check's own answer: the tokens taken stay the subject's, so they count in what it has left.
        const [r] = reply.results;
        const own = { ...reply, results: [{ ...r!, remaining: r!.remaining + w.spare * MICRO }] };
        w.resolve(this.#answer(w, own, sentAt, answeredAt));
        this.#took(w, own, reply, sentAt, answeredAt);
      } else this.#again(w, reply);
    });
  }

  /** A check whose take did not fit: charged nothing, it goes again alone (to the agent once this client closed). */
  #again(w: Waiting, reply: EncodedReply): void {
    const pace = w.pace!;
    pace.taking = false;
    pace.bucketLeft = Math.max(0, reply.results[0]!.remaining / MICRO);
    this.#stats.grants.short++;
    if (this.#closed) return w.resolve(undefined);
    w.spare = 0;
    pace.queued++;
    this.#enqueue(w);
  }

  /** What a check's call tells its subject's pace: what the bucket has left, and the tokens taken ahead, if any. */
  #took(
    w: Waiting,
    reply: EncodedReply,
    spare: EncodedReply | undefined,
    sentAt: number,
    answeredAt: number,
  ): void {
    const pace = w.pace!;
    const last = (spare ?? reply).results[0]!;
    pace.bucketLeft = Math.max(0, last.remaining / MICRO);
    if (spare === undefined) return;
    pace.taking = false;
    if (!spare.allowed) return;
    const state = this.#policies.get(w.held.term.policy);
    this.#stats.grants.taken++;
    this.#stats.grants.tokens += w.spare;
    // The horizon's end in Redis time, read off the term as a call's deadline is (late by at most the term
    // request's round trip): a hand-back that runs later changes nothing.
    const returnBy = sentAt + this.#horizonMs;
    const back: HandBack = {
      sha: w.held.term.refundSha!,
      key: w.request.keys[0]!,
      capacity: w.request.checks[0]!.capacity,
      tokens: w.spare,
      by: returnBy,
      deadline: Math.max(1, redisMicrosAt(w.held, returnBy)),
    };
    // Forgotten meanwhile (a flood of subjects), or the client closed: taken, and handed back at once.
    if (this.#closed || state?.paces.get(w.keyed) !== pace) return this.#handBack(back);
    // One take's tokens at a time: they carry its horizon and bucket (none are held when a take leaves; any are
    // handed back rather than relabelled).
    this.#giveBack(pace);
    pace.tokens = w.spare;
    pace.returnTo = back;
    this.#holding.add(pace);
    // Spent only within four fifths of the horizon from when the take was sent (the rest is for handing back), and
    // only while the term holds this bucket.
    pace.until = sentAt + this.#horizonMs - Math.max(1, Math.floor(this.#horizonMs / RETURN_SHARE));
    pace.takenAt = sentAt;
    if (this.#sweeper === undefined) {
      const every = Math.max(MIN_SWEEP_MS, this.#horizonMs / RETURN_SHARE / 2);
      this.#sweeper = setInterval(this.#sweep, every);
      this.#sweeper.unref();
    }
    pace.bucketId = w.held.bucketId;
    seen(pace, last, answeredAt);
    // The subject's checks that queued while the take was on the wire (a burst) are admitted on them now.
    if (pace.queued > 0) {
      const rest: Waiting[] = [];
      for (const x of this.#waiting) {
        const cost = x.request.checks[0]!.cost / MICRO;
        if (x.pace === pace && this.#spendable(pace, x.held, cost, answeredAt)) {
          pace.queued--;
          x.resolve(this.#spend(state, x.held, x.subject, pace, cost, answeredAt));
        } else rest.push(x);
      }
      this.#waiting = rest;
    }
  }

  /**
   * The tokens `pace` holds may pay for a check of `cost` under `held` at `now`: enough of them, taken from the
   * bucket the term still holds, within their spending time and the term's.
   */
  #spendable(pace: Pace, held: Held, cost: number, now: number): boolean {
    return (
      pace.tokens >= cost && held.bucketId === pace.bucketId && now < pace.until && now < held.usableUntil
    );
  }

  /** EVALSHA, or EVAL with the source when Redis lost its script cache; rejects after the timeout. */
  async #run(sha: string, keys: readonly string[], argv: readonly string[]): Promise<unknown> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      // Given up one turn after the timer: a loop that was busy past the timeout (a burst's requests) runs its
      // timers before it reads its sockets, so an answer that came in time is read first, not counted a failure.
      timer = setTimeout(
        () => setImmediate(() => reject(new Error('direct: no answer from Redis in time'))),
        this.#timeoutMs,
      );
    });
    const call = async (): Promise<unknown> => {
      try {
        return await this.#redis.evalsha(sha, keys.length, ...keys, ...argv);
      } catch (error) {
        const noScript = String((error as Error)?.message).startsWith('NOSCRIPT');
        const source = this.#sources.get(sha);
        // A script this process has no source of (an agent upgraded since): the next term brings it.
        if (noScript && source === undefined) this.#needSource = true;
        if (!noScript || source === undefined) throw error;
        return this.#redis.eval(source, keys.length, ...keys, ...argv);
      }
    };
    try {
      return await Promise.race([call(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * The decision for one check from its script reply (its call sent at `sentAt`, answered at `answeredAt`), or
   * undefined when a refusal must go to the agent. A final refusal is remembered for its subject until its
   * retry-after.
   */
  #answer(w: Waiting, reply: EncodedReply, sentAt: number, answeredAt: number): DirectDecision | undefined {
    const { held } = w;
    const { term } = held;
    const decision = decodeReply(reply);
    const b = decision.results[0]!;
    const cost = w.request.checks[0]!.cost / MICRO;
    const state = this.#policies.get(term.policy)!;
    if (!decision.allowed && term.refusals === 'agent') {
      this.#stats.toAgent.refused++;
      return undefined;
    }
    const reason =
      b.retryAfterMs === null
        ? 'cost_exceeds_share'
        : !decision.allowed && b.retryAfterMs > 0
          ? (term.refusedReason ?? 'subject_exhausted')
          : undefined;
    // Not while this process holds tokens taken ahead for the subject: they go back to the bucket within the
    // horizon (or are spent here), and the bucket then holds more than this refusal saw.
    if (!decision.allowed && reason !== undefined && !(w.pace !== undefined && w.pace.tokens > 0)) {
      // Until a token could have come: the script's retry-after runs from its own instant, after this call left
      // (a millisecond less for its rounding up), and for DENIAL_RECHECK_MS at most (a bucket lost with a Redis
      // restart or refilled by hand-backs shows then, not at a retry-after minutes away); a cost the bucket can
      // never pay, for the rest of the term. A caller is told the later end, from when the answer came, as the
      // script's own answer tells it.
      const until =
        b.retryAfterMs === null ? held.usableUntil : sentAt + Math.min(b.retryAfterMs - 1, DENIAL_RECHECK_MS);
      remember(state.refusals, refusalKey(w.keyed, cost), {
        until,
        retryAt: answeredAt + (b.retryAfterMs ?? 0),
        cost,
        bucketId: held.bucketId,
        at: sentAt,
        remaining: b.remaining,
        fullAt: b.resetMs === null ? null : answeredAt + b.resetMs,
        reason,
      });
    }
    return this.#decision(
      state,
      held,
      w.subject,
      decision.allowed,
      cost,
      b.remaining,
      b.resetMs,
      b.retryAfterMs,
      reason,
    );
  }

  /** A check of a remembered refusal's subject and cost before its retry-after: refused again, no call. */
  #recall(
    state: PolicyState,
    held: Held,
    subject: string,
    r: Refusal,
    cost: number,
    now: number,
  ): DirectDecision {
    this.#stats.recalled++;
    const retryAfterMs = r.reason === 'cost_exceeds_share' ? null : Math.max(1, Math.ceil(r.retryAt - now));
    // At most what it held then, refilled since, and still short of the (whole) cost it refused.
    const { capacity, refillPerSecond } = held.term.bucket;
    const remaining = Math.min(capacity, r.cost - 1, r.remaining + (refillPerSecond * (now - r.at)) / 1000);
    const resetMs = r.fullAt === null ? null : Math.max(0, Math.ceil(r.fullAt - now));
    return this.#decision(state, held, subject, false, cost, remaining, resetMs, retryAfterMs, r.reason);
  }

  #decision(
    state: PolicyState,
    held: Held,
    subject: string,
    allowed: boolean,
    cost: number,
    remaining: number,
    resetMs: number | null,
    retryAfterMs: number | null,
    reason: Refusal['reason'] | undefined,
  ): DirectDecision {
    const { term } = held;
    countUsage(state, subject, allowed ? cost : 0, allowed ? 0 : cost);
    this.#stats[allowed ? 'admitted' : 'refused']++;
    const result: ClientCheckResult = {
      policy: term.policy,
      allowed,
      remaining: remaining > 0 ? Math.floor(remaining) : 0,
      limit: term.limit,
      resetMs,
      retryAfterMs,
      mode: term.mode,
    };
    if (reason !== undefined) result.reason = reason;
    const budget = term.budget === undefined ? undefined : { ...term.budget, borrowable: false };
    const headers = rateLimitHeaders(
      allowed,
      [
        {
          result: { ...result, remaining, limit: term.bucket.capacity, mode: term.mode },
          windowSeconds: term.window,
          violated: !allowed,
          budget,
        },
      ],
      term.headers.legacy,
      term.headers.draft,
    );
    return {
      allowed,
      retryAfterMs: allowed ? 0 : retryAfterMs,
      results: [result],
      headers,
      local: 'direct',
    };
  }
}

/** What a pace's held tokens report of their bucket: what `result` (answered at `answeredAt`) said it had left. */
function seen(pace: Pace, result: EncodedReply['results'][number], answeredAt: number): void {
  pace.left = Math.max(0, result.remaining / MICRO);
  pace.fullAt = result.resetMs < 0 ? null : answeredAt + result.resetMs;
}

/**
 * The Redis TIME (µs) of monotonic instant `t`, read off a term: its `deadlineMicros` stands for `endsAt`. Late by at
 * most the term request's round trip (the agent issued the term after this process sent the request).
 */
function redisMicrosAt(held: Held, t: number): number {
  return held.term.deadlineMicros - Math.round((held.endsAt - t) * 1000);
}

/** A remembered refusal's key: the keyed subject, and its cost when not 1 (a subject has no control character). */
function refusalKey(subject: string, cost: number): string {
  return cost === 1 ? subject : `${subject}\n${cost}`;
}

/**
 * Remember a refusal. Past MAX_REMEMBERED subjects the memory starts again empty: forgetting a refusal costs one
 * script call, never a wrong answer, and a flood of distinct subjects costs no sweep.
 */
function remember(refusals: Map<string, Refusal>, subject: string, refusal: Refusal): void {
  if (refusals.size >= MAX_REMEMBERED) refusals.clear();
  refusals.set(subject, refusal);
}

/** A term names another secret than this process's (or this process has none). */
class KeyMismatch extends Error {}

function countUsage(state: PolicyState, subject: string, admitted: number, refused: number): void {
  const counts = state.usage.get(subject);
  if (counts !== undefined) {
    counts[0] += admitted;
    counts[1] += refused;
  } else if (state.usage.size < MAX_COUNTED_SUBJECTS) state.usage.set(subject, [admitted, refused]);
}

/**
 * The usage to report, whole tokens, busiest subjects first, at most MAX_TERM_USAGE of them and about `bytes` of
 * JSON, and a clean slate. The subjects left out are the quietest of the interval: the coordinator moves shares by
 * demand, which the busiest make, and the agent's own decisions still report every subject they see.
 */
function takeUsage(state: PolicyState, bytes: number): TermUsage[] {
  // The busiest MAX_TERM_USAGE by a threshold, not a sort of every subject counted (up to 16,384, at each renewal,
  // on the event loop): the totals alone sorted as numbers, then ties at the threshold kept in the order counted,
  // as a stable sort of them all would keep them.
  let threshold = -Infinity;
  let ties = Infinity;
  const n = state.usage.size;
  if (n > MAX_TERM_USAGE) {
    const totals = new Float64Array(n);
    let i = 0;
    for (const [admitted, refused] of state.usage.values()) totals[i++] = admitted + refused;
    totals.sort();
    threshold = totals[n - MAX_TERM_USAGE]!;
    let above = n;
    while (above > 0 && totals[above - 1]! > threshold) above--;
    ties = MAX_TERM_USAGE - (n - above);
  }
  const all: TermUsage[] = [];
  for (const [subject, [admitted, refused]] of state.usage) {
    const total = admitted + refused;
    if (total > threshold || (total === threshold && ties-- > 0))
      all.push([subject, Math.round(admitted), Math.round(refused)]);
  }
  state.usage.clear();
  if (all.length > 1) all.sort((a, b) => b[1] + b[2] - (a[1] + a[2]));
  const out: TermUsage[] = [];
  let size = 0;
  for (const entry of all) {
    // `["subject",n,m],`: a subject decided here is its own normalized form, which JSON never escapes.
    size += entry[0].length + 30;
    if (out.length >= MAX_TERM_USAGE || size > bytes) break;
    out.push(entry);
  }
  return out;
}
