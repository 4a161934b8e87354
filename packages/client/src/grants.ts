/**
 * Local grants: the client holds a small allowance of a hot subject's tokens and decides that subject's checks
 * in its own process until the allowance is spent or expires; what is left is handed back.
 *
 * The tokens leave the subject's bucket at the agent when the grant is taken (lua/grant.lua, like a loan between
 * regions): they are spent once, here, or handed back, or lost with the process. The takes and returns the pool
 * wants in one event-loop turn leave together, as one `POST /v1/grants/batch` exchange (up to 128 items, answered
 * per item; an agent without that route gets `POST /v1/grants` and `POST /v1/grants/return` one by one). So a grant never admits more than the bucket held: a crashed process, a lost answer or a
 * failed return means fewer admissions, never more. Each grant comes with an id the agent drew; a return names it
 * and is credited at most what that grant took, once (the agent refuses an unknown or expired id: the rest is
 * counted lost). A rest held over from one grant into the next is handed back against the newest grants first. The agent caps one grant at a tenth of the bucket; this pool
 * asks for what the subject's observed rate in this process needs over `horizonMs`, to be held that long (1 to 5
 * s), and holds at most one grant (plus the next one, taken when half is spent) per subject. A subject that goes
 * cold (no check for three of its observed intervals, at least a second) hands its rest back before expiry.
 *
 * Only single checks without `dryRun` or `idempotencyKey`, of a cost the agent accepts (`isTokenCost`: a number of
 * at least one micro-token), are decided on a grant; layered checks, and any other cost (NaN, 0, negative,
 * infinite, not a number), always go to the agent, which refuses the latter (`AGT_ERR_INVALID_COST`). A policy
 * the agent gives no grants for (strict, sliding log, concurrency, daily, sharded, a subject-creation cap:
 * `AGT_ERR_GRANT_NOT_ALLOWED`) is remembered and never asked again.
 *
 * The denial cache: when the agent refuses a subject over quota (no reason, or `subject_exhausted`) with a
 * Retry-After, the same subject's checks of that same cost are refused here until then, with the remaining
 * wait as Retry-After, without asking the agent, for DENIAL_RECHECK_MS at most: then one check asks the agent
 * again (a budget raised or a plan upgraded shows within that, not at a Retry-After minutes away). Only for
 * policies the agent gives grants for (learned from the grant route's answer: a first denial of a policy not yet
 * known asks it for a grant of one token), that is
 * regional token buckets, where Retry-After is the time until the subject's bucket refills that cost: nothing
 * but refill adds tokens there before then except tokens handed back (grants, reservations) or a bigger regional
 * share, and both only make the agent's answer come true sooner, so the cache can refuse a request the agent
 * would have admitted a little early, never admit one. Not for concurrency policies (a release frees a slot at
 * any moment; Retry-After is only the oldest lease's expiry), nor strict ones (decided at the home region),
 * nor denials of a shared bucket, a share or a failure (their Retry-After is not the subject's refill).
 *
 * A repeated denial's headers say what the agent's said, counted down: `RateLimit-Policy` as the agent last sent
 * it for the policy (every answer carrying it updates it: a policy edit shows at once), and the agent's own
 * `RateLimit` item of that denial, whose `r` is kept and whose `t` counts down to the instant it named. Which
 * instant that is depends on the agent's draft (-11: the quota restored; -10: the cost fits), so it is not
 * assumed: it is the result's `resetMs` or `retryAfterMs` whose whole seconds the agent's `t` equals (exact), or
 * else `t` itself (a borrowing check's global budget; at most a second late). `Retry-After` is the cache's own
 * remaining wait. A subject whose limit an agent answer shows changed loses its cached denial and hands back the
 * grant it holds (another bucket: its tokens are not spent under the new limit).
 */
import type { DecisionRequest, SingleDecisionRequest } from '../../../core/wire/agent.js';
import {
  GrantResponse,
  MAX_GRANT_ITEMS_PER_BATCH,
  MAX_GRANT_TTL_MS,
  type GrantRequest,
  type GrantReturnRequest,
} from '../../../core/wire/grant.js';
import { isTokenCost } from '../../../core/wire/bucket.js';
import type { ClientCheckResult, Decision } from './agent-client.js';

/** How the client uses local grants. */
export interface GrantOptions {
  /** Decisions per second of one subject in this process from which it holds a grant. Default 20. */
  hotPerSecond?: number;
  /**
   * How much of the subject's observed rate one grant covers, ms (the agent caps it at a tenth of the bucket); the
   * grant is held that long (at least 1 s, at most 5 s). Default 250.
   */
  horizonMs?: number;
  /**
   * Fewest tokens worth a grant. Takes and returns travel in batches like decisions, but at the agent each costs
   * about what a decision does, and a grant's rest often comes back as a return: a grant of a few tokens saves
   * fewer decisions than it costs. A subject is given one only when its rate over `horizonMs` and the agent's cap
   * (a tenth of the bucket) come to at least this many. Default 16, so a bucket of fewer than 160 is never
   * granted (docs/agent.md, "Only grants that pay", has the measurements).
   */
  minTokens?: number;
  /** Most subjects tracked at once (the oldest are forgotten, their grants handed back). Default 1000. */
  maxSubjects?: number;
  /**
   * Repeat the agent's denial of a subject in this process until its Retry-After, for every subject (hot or
   * not) of a policy the agent gives grants for (token buckets). Default true.
   */
  denials?: boolean;
}

/** What the pool has done since the client was made. */
export interface GrantStats {
  /** Decisions made in this process on a grant (the agent was not asked). */
  local: number;
  /** Denials given in this process while the agent's last denial of the subject held (the agent was not asked). */
  denied: number;
  /** Grants taken with tokens / asked for and found empty / failed (no answer, refused). */
  taken: number;
  empty: number;
  failed: number;
  /** Tokens taken, handed back (credited at the agent) and lost (a failed return). */
  tokensTaken: number;
  tokensReturned: number;
  tokensLost: number;
  /** Tokens held in this process now, over every subject. */
  held: number;
}

/** A decision made on a grant: `local` says so. */
export interface GrantDecision extends Decision {
  local: 'grant';
}

/**
 * Sends one JSON body to the agent: the status, the parsed answer and a problem's code (the client's own keep-alive
 * sockets). The pool posts to `/v1/grants/batch`, or to `/v1/grants` and `/v1/grants/return` when the agent has no
 * batch route.
 */
export type GrantTransport = (
  path: string,
  body: object,
) => Promise<{ status: number; json: unknown; code?: string | undefined }>;

interface Entry {
  policy: string;
  subject: string;
  /**
   * Rate estimate: calls since `since` (the call that opened the first window is not one of them: it only starts
   * the clock), and the windows' rates averaged, the last one weighing half.
   */
  since: number;
  calls: number;
  perSecond: number;
  /** Tokens of the grant not yet spent, and when it expires (ms on the pool's clock). */
  tokens: number;
  /** The grants those tokens came from, oldest first: the agent's id and the tokens it took (for the returns). */
  grants: { id: string; granted: number }[];
  expiresAt: number;
  /** What the agent last said about the bucket: its capacity, and what was left after the last take. */
  limit: number;
  bucketRemaining: number;
  /** The largest cost a check of the policy may have, as the last grant answer said (1 until one says). */
  maxCost: number;
  taking: boolean;
  /**
   * The agent denied this subject a check of `deniedCost` and said when it would fit (ms on the pool's clock):
   * until then (`recheckAt`, below, bounds how long) the same answer is given here to checks of that same cost
   * (another cost's wait is not known here). Tokens handed back by other processes meanwhile only make it stricter.
   */
  deniedUntil: number;
  /**
   * The cached denial is answered here until this (at most DENIAL_RECHECK_MS after the agent gave it, and never
   * past `deniedUntil`); then one check goes to the agent, whose answer is cached again or admits.
   */
  recheckAt: number;
  deniedCost: number;
  /** The agent's reason for that denial, repeated with it. */
  deniedReason: ClientCheckResult['reason'];
  /** The whole tokens the agent said were left at that denial (fewer than the cost). */
  deniedRemaining: number;
  /**
   * The agent's `RateLimit` item of that denial, repeated with it (undefined: it sent none, and neither does the
   * repetition): its `r`; the instant its `t` counts down to (ms on the pool's clock; null: it gave no `t`); and
   * its legacy `X-RateLimit-Limit` when it sent the legacy headers.
   */
  deniedHeader: DeniedHeader | undefined;
  /** No take before this (ms on the pool's clock): after an empty take or a failure. */
  quietUntil: number;
  /** The last check of this subject here (ms on the pool's clock). */
  lastSeen: number;
  timer: NodeJS.Timeout | undefined;
}

const RATE_WINDOW_MS = 250;
const NOT_ALLOWED = 'AGT_ERR_GRANT_NOT_ALLOWED';
/** A grant is spent no later than this before the agent's expiry, so the rest is handed back in time. */
const EXPIRY_MARGIN_MS = 50;
const FAILURE_BACKOFF_MS = 1000;
/**
 * A cached denial is answered here for at most this long before one check asks the agent again: a budget raised,
 * a plan upgraded (another class) or a bucket refilled by hand-backs shows within it, not only at the agent's
 * Retry-After (which may be minutes away).
 */
export const DENIAL_RECHECK_MS = 1000;
const NOT_FOUND = 'AGT_ERR_NOT_FOUND';
/** Shortest and longest life a grant is asked for, ms (the wire allows 100 to MAX_GRANT_TTL_MS). */
const MIN_TTL_MS = 1000;
/** A subject holding tokens is cold after this many of its observed intervals without a check (at least 1 s). */
const COLD_INTERVALS = 3;
const MIN_COLD_MS = 1000;

/** What the agent's headers said at a denial the pool repeats (Entry.deniedHeader). */
interface DeniedHeader {
  r: number;
  tAt: number | null;
  legacyLimit: string | undefined;
}

/** A take waiting for its exchange. */
interface TakeItem {
  entry: Entry;
  body: GrantRequest;
}

/** A return waiting for its exchange. */
interface ReturnItem {
  entry: Entry;
  body: GrantReturnRequest;
}

/** One item's answer: the status its single route would have given, the body, a problem's code. */
type ItemAnswer = { status: number; json: unknown; code?: string | undefined };

export class GrantPool {
  readonly #send: GrantTransport;
  readonly #hot: number;
  readonly #horizonMs: number;
  readonly #maxSubjects: number;
  readonly #minTokens: number;
  /**
   * Subjects tracked, in two generations: this one's, and the last one's (`#previous`), forgotten at the next
   * rotation unless seen again meanwhile (then moved to this one) or busy (a grant, a take or a denial held).
   */
  #entries = new Map<string, Entry>();
  #previous = new Map<string, Entry>();
  readonly #noGrants = new Set<string>();
  /** Policies the agent answered a grant request for (200): token buckets, whose denials this pool repeats. */
  readonly #grantable = new Set<string>();
  readonly #denials: boolean;
  readonly #pending = new Set<Promise<unknown>>();
  /** Takes and returns of this turn, sent together at its end. */
  #takes: TakeItem[] = [];
  #returns: ReturnItem[] = [];
  #flushScheduled = false;
  /** The agent has no batch route: takes and returns go one by one. */
  #single = false;
  /** Entries holding tokens, watched for going cold. */
  readonly #holders = new Set<Entry>();
  #sweep: NodeJS.Timeout | undefined;
  readonly #ttlMs: number;
  readonly #policyHeaders = new Map<string, string>();
  readonly #stats = {
    local: 0,
    denied: 0,
    taken: 0,
    empty: 0,
    failed: 0,
    tokensTaken: 0,
    tokensReturned: 0,
    tokensLost: 0,
  };
  #closed = false;

  readonly #now: () => number;

  /**
   * `now`: ms on a monotonic clock (tests pass their own): only intervals are compared, so a wall-clock step
   * (an NTP correction, a resumed VM) neither stretches a cached denial nor keeps a grant past its expiry.
   */
  constructor(send: GrantTransport, options: GrantOptions = {}, now: () => number = () => performance.now()) {
    this.#send = send;
    this.#now = now;
    this.#hot = options.hotPerSecond ?? 20;
    this.#horizonMs = options.horizonMs ?? 250;
    this.#maxSubjects = options.maxSubjects ?? 1000;
    this.#minTokens = options.minTokens ?? 16;
    this.#denials = options.denials ?? true;
    this.#ttlMs = Math.min(MAX_GRANT_TTL_MS, Math.max(MIN_TTL_MS, Math.ceil(this.#horizonMs)));
    if (!(this.#hot > 0 && this.#horizonMs > 0 && this.#maxSubjects >= 1 && this.#minTokens >= 1))
      throw new TypeError('grants: hotPerSecond and horizonMs must be > 0, maxSubjects and minTokens >= 1');
  }

  stats(): GrantStats {
    let held = 0;
    for (const e of this.#entries.values()) held += e.tokens;
    for (const e of this.#previous.values()) held += e.tokens;
    // Sums of fractional amounts carry float noise (9.9 + 9.8 is 19.700000000000003): counted to the micro-token,
    // the agent's own unit, which is what a person reading the stats can use.
    const { tokensTaken, tokensReturned, tokensLost } = this.#stats;
    return {
      ...this.#stats,
      tokensTaken: microTokens(tokensTaken),
      tokensReturned: microTokens(tokensReturned),
      tokensLost: microTokens(tokensLost),
      held: microTokens(held),
    };
  }

  /**
   * Decide `body` on a grant this process holds, or undefined (ask the agent). Counts the subject's rate either
   * way; synchronous.
   */
  trySpend(body: DecisionRequest): GrantDecision | undefined {
    if (this.#closed || !grantable(body)) return undefined;
    // Only a cost the agent accepts is decided here: NaN, 0, a negative or infinite cost (or one not a number at
    // all) would pass `tokens < cost` or add tokens, admitting what the agent refuses (AGT_ERR_INVALID_COST). The
    // agent is asked, and refuses it; the subject's rate does not count it (no decision is made).
    if (!validCost(body)) return undefined;
    if (this.#noGrants.has(body.policy)) return undefined;
    const entry = this.#entry(body.policy, body.subject, this.#now());
    const cost = body.cost ?? 1;
    const now = this.#now();
    // A cost above the policy's maxCost is the agent's to refuse (AGT_ERR_COST_ABOVE_MAX), never admitted here.
    if (entry.tokens < cost || now >= entry.expiresAt || cost > entry.maxCost) {
      if (now < entry.recheckAt && cost === entry.deniedCost) {
        this.#stats.denied++;
        return this.#denial(entry, entry.deniedUntil - now);
      }
      return undefined;
    }
    entry.tokens -= cost;
    this.#stats.local++;
    // The next grant before this one runs out, so a hot subject does not wait on the agent.
    if (entry.tokens < this.#amountFor(entry) / 2) this.#take(entry, now);
    return this.#decision(entry);
  }

  /** Told of every decision the agent made: a hot subject it admitted gets a grant for its next checks. */
  observe(body: DecisionRequest, decision: Decision): void {
    // A check naming a class is neither granted nor remembered as a denial: the pool keeps one entry per
    // subject, at the class the policy gives it, and another class's bucket has other limits.
    // Nor is a check of a cost the agent refuses (it answers no decision for one): nothing is learned from it.
    if (this.#closed || !grantable(body) || !validCost(body) || decision.degraded !== undefined) return;
    const result = decision.results[0];
    const header = decision.headers['RateLimit-Policy'];
    // The agent's latest word on the policy, so an edit (another capacity or window) shows in the next answer
    // given here.
    if (header !== undefined && this.#policyHeaders.get(body.policy) !== header)
      this.#policyHeaders.set(body.policy, header);
    if (this.#noGrants.has(body.policy)) return;
    const entry = this.#lookup(keyOf(body.policy, body.subject));
    if (result?.mode === 'strict') {
      // A strict policy is decided at its home from the whole budget, never here: a policy made strict hands back
      // what it held from its regional bucket and forgets a denial remembered from it, and whether it is
      // grantable is learned again from the grant route (which refuses a strict policy).
      // The first such answer walks the policy's other subjects too (their grants are spent without an answer).
      if (this.#grantable.delete(body.policy)) {
        for (const e of [...this.#entries.values(), ...this.#previous.values()])
          if (e.policy === body.policy) this.#bucketChanged(e);
      } else if (entry !== undefined) this.#bucketChanged(entry);
      return;
    }
    if (entry === undefined) return;
    if (result?.limit !== undefined) {
      // Another limit is another bucket (a policy edit, another class): a denial remembered from the old one is
      // not repeated, and tokens held from it are not spent under the new limit but handed back.
      if (result.limit !== entry.limit) this.#bucketChanged(entry);
      entry.limit = result.limit;
    }
    const now = this.#now();
    if (decision.allowed) {
      if (entry.perSecond >= this.#hot) this.#take(entry, now);
      return;
    }
    if (
      !this.#denials ||
      result === undefined ||
      (result.reason !== undefined && result.reason !== 'subject_exhausted') ||
      result.retryAfterMs === null ||
      result.retryAfterMs <= 0
    )
      return;
    if (!this.#grantable.has(body.policy)) {
      // Whether the policy is a token bucket is learned once, from the grant route: a grant request for this
      // subject (its tokens, if any, are spent here or handed back like any grant's).
      this.#take(entry, now, true);
      return;
    }
    // Over quota, not a failure: the agent said when this cost fits, from the subject's token bucket; until then
    // the same answer is given here (see the class comment: it can only refuse what the agent would refuse).
    entry.deniedUntil = now + result.retryAfterMs;
    entry.recheckAt = now + Math.min(result.retryAfterMs, DENIAL_RECHECK_MS);
    entry.deniedCost = body.cost ?? 1;
    entry.deniedReason = result.reason;
    entry.deniedRemaining = result.remaining ?? 0;
    entry.deniedHeader = deniedHeader(body.policy, decision.headers, result, now);
  }

  /** Hand back every grant's rest and stop taking new ones. */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#sweep);
    this.#sweep = undefined;
    for (const entry of this.#entries.values()) this.#giveBack(entry);
    for (const entry of this.#previous.values()) this.#giveBack(entry);
    // Takes answered meanwhile hand their tokens back too: until nothing is left to send or wait for.
    while (this.#takes.length + this.#returns.length + this.#pending.size > 0) {
      this.#flush();
      await Promise.allSettled([...this.#pending]);
    }
  }

  #entry(policy: string, subject: string, now: number): Entry {
    const key = keyOf(policy, subject);
    let entry = this.#lookup(key);
    if (entry === undefined) {
      if (this.#entries.size >= Math.ceil(this.#maxSubjects / 2)) this.#rotate(now);
      entry = {
        policy,
        subject,
        since: now,
        calls: -1,
        perSecond: 0,
        tokens: 0,
        grants: [],
        expiresAt: 0,
        limit: 0,
        bucketRemaining: 0,
        maxCost: 1,
        taking: false,
        deniedUntil: 0,
        recheckAt: 0,
        deniedCost: 0,
        deniedReason: undefined,
        deniedRemaining: 0,
        deniedHeader: undefined,
        quietUntil: 0,
        lastSeen: now,
        timer: undefined,
      };
      this.#entries.set(key, entry);
    }
    entry.calls++;
    entry.lastSeen = now;
    const elapsed = now - entry.since;
    if (elapsed >= RATE_WINDOW_MS) {
      const rate = (entry.calls * 1000) / elapsed;
      entry.perSecond = entry.perSecond > 0 ? (entry.perSecond + rate) / 2 : rate;
      entry.calls = 0;
      entry.since = now;
    }
    return entry;
  }

  /** The subject's entry, moved to this generation when it was in the last one. */
  #lookup(key: string): Entry | undefined {
    let entry = this.#entries.get(key);
    if (entry !== undefined) return entry;
    entry = this.#previous.get(key);
    if (entry !== undefined) {
      this.#previous.delete(key);
      this.#entries.set(key, entry);
    }
    return entry;
  }

  /**
   * Make room for new subjects, in O(1) per subject tracked: the last generation's subjects not seen since are
   * forgotten (tracked again at their next check), except busy ones (a grant held or being taken, a denial
   * held), which start the next generation, at most a quarter of `maxSubjects` of them (the rest hand their
   * grant back: fewer local decisions, never more).
   */
  #rotate(now: number): void {
    const next = new Map<string, Entry>();
    const keep = Math.floor(this.#maxSubjects / 4);
    for (const [key, entry] of this.#previous) {
      const busy = entry.tokens > 0 || entry.taking || entry.recheckAt > now;
      if (busy && next.size < keep) next.set(key, entry);
      else this.#giveBack(entry);
    }
    this.#previous = this.#entries;
    this.#entries = next;
  }

  #amountFor(entry: Entry): number {
    const wanted = Math.ceil((entry.perSecond * this.#horizonMs) / 1000);
    const cap = entry.limit > 0 ? Math.max(1, Math.floor(entry.limit / 10)) : wanted;
    return Math.max(1, Math.min(wanted, cap, 1000));
  }

  /** `learn`: a take that only asks whether the policy is granted at all (one token is enough). */
  #take(entry: Entry, now: number, learn = false): void {
    if (entry.taking || now < entry.quietUntil || this.#closed) return;
    const amount = this.#amountFor(entry);
    if (!learn && amount < this.#minTokens) return;
    entry.taking = true;
    const body: GrantRequest = { policy: entry.policy, subject: entry.subject, amount };
    if (this.#ttlMs !== MIN_TTL_MS) body.ttlMs = this.#ttlMs;
    this.#takes.push({ entry, body });
    this.#schedule();
  }

  /** What the agent answered a take (undefined: no answer): the tokens join the entry's. */
  #took(item: TakeItem, answer: ItemAnswer | undefined): void {
    const { entry } = item;
    entry.taking = false;
    if (answer === undefined || answer.status !== 200) {
      if (answer?.code === NOT_ALLOWED) this.#noGrants.add(entry.policy);
      this.#stats.failed++;
      entry.quietUntil = this.#now() + FAILURE_BACKOFF_MS;
      return;
    }
    const parsed = GrantResponse.safeParse(answer.json);
    if (!parsed.success) {
      // Tokens may have been taken: they are lost (fewer admissions, never more).
      this.#stats.failed++;
      entry.quietUntil = this.#now() + FAILURE_BACKOFF_MS;
      return;
    }
    const g = parsed.data;
    this.#grantable.add(entry.policy);
    if (g.limit !== entry.limit) this.#bucketChanged(entry);
    entry.limit = g.limit;
    entry.bucketRemaining = g.remaining;
    entry.maxCost = g.maxCost ?? 1;
    if (g.granted <= 0) {
      this.#stats.empty++;
      entry.quietUntil = this.#now() + Math.max(RATE_WINDOW_MS, g.refillMs ?? FAILURE_BACKOFF_MS);
      return;
    }
    this.#stats.taken++;
    this.#stats.tokensTaken += g.granted;
    if (g.grant !== null) entry.grants.push({ id: g.grant, granted: g.granted });
    if (this.#closed) {
      entry.tokens += g.granted;
      this.#giveBack(entry);
      return;
    }
    const at = this.#now();
    // A rest still held from the previous grant joins this one and expires with it.
    entry.tokens += g.granted;
    entry.expiresAt = at + g.expiresInMs - EXPIRY_MARGIN_MS;
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => this.#giveBack(entry), Math.max(0, entry.expiresAt - at));
    entry.timer.unref();
    this.#holders.add(entry);
    if (this.#sweep === undefined) {
      this.#sweep = setInterval(this.#sweepCold, MIN_COLD_MS);
      this.#sweep.unref();
    }
  }

  /** Hand back the rests of subjects gone cold: no check for COLD_INTERVALS of their intervals (at least 1 s). */
  readonly #sweepCold = (): void => {
    const now = this.#now();
    for (const entry of this.#holders) {
      const interval = entry.perSecond > 0 ? 1000 / entry.perSecond : 0;
      if (now - entry.lastSeen >= Math.max(MIN_COLD_MS, COLD_INTERVALS * interval)) this.#giveBack(entry);
    }
    if (this.#holders.size === 0) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
  };

  /**
   * The agent answered with another limit than `entry` knew (none yet, or a policy edit): forget the cached denial,
   * and hand back what is held from the old bucket (the agent credits it, capped at the bucket, or refuses a
   * return to another version's bucket): spent here, those tokens would admit under the old limit.
   */
  #bucketChanged(entry: Entry): void {
    entry.deniedUntil = 0;
    entry.recheckAt = 0;
    if (entry.limit > 0 && entry.tokens > 0) this.#giveBack(entry);
  }

  /**
   * Hand back what `entry` holds (its grant expired, it went cold, or the pool closes): one return per grant it
   * came from, the newest first (the oldest tokens are spent first), each at most what that grant took.
   */
  #giveBack(entry: Entry): void {
    clearTimeout(entry.timer);
    entry.timer = undefined;
    entry.expiresAt = 0;
    this.#holders.delete(entry);
    let rest = Math.floor(entry.tokens * 1e6) / 1e6;
    const grants = entry.grants;
    entry.tokens = 0;
    entry.grants = [];
    for (let i = grants.length - 1; i >= 0 && rest >= 1e-6; i--) {
      const amount = microTokens(Math.min(rest, grants[i]!.granted));
      rest = microTokens(rest - amount);
      if (amount >= 1e-6) {
        const body = { policy: entry.policy, subject: entry.subject, grant: grants[i]!.id, amount };
        this.#returns.push({ entry, body });
        this.#schedule();
      }
    }
    // Tokens no grant accounts for (none, unless the agent answered oddly) cannot be handed back.
    if (rest >= 1e-6) this.#stats.tokensLost += rest;
  }

  /** What the agent answered a return (undefined: no answer): credited, the rest lost. */
  #returned(item: ReturnItem, answer: ItemAnswer | undefined): void {
    const { amount } = item.body;
    const credited =
      answer?.status === 200 ? (answer.json as { credited?: unknown } | null)?.credited : undefined;
    if (typeof credited === 'number') {
      this.#stats.tokensReturned += credited;
      this.#stats.tokensLost += Math.max(0, amount - credited);
    } else this.#stats.tokensLost += amount;
  }

  #schedule(): void {
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    setImmediate(this.#flush);
  }

  /** Send this turn's takes and returns: one exchange per MAX_GRANT_ITEMS_PER_BATCH items, returns first. */
  readonly #flush = (): void => {
    this.#flushScheduled = false;
    while (this.#takes.length + this.#returns.length > 0) {
      const returns = this.#returns.splice(0, MAX_GRANT_ITEMS_PER_BATCH);
      const takes = this.#takes.splice(0, MAX_GRANT_ITEMS_PER_BATCH - returns.length);
      const work = this.#exchange(takes, returns).finally(() => this.#pending.delete(work));
      this.#pending.add(work);
    }
  };

  /** One exchange carrying `takes` and `returns` (or, to an agent without the batch route, one each). */
  async #exchange(takes: TakeItem[], returns: ReturnItem[]): Promise<void> {
    if (this.#single) return this.#singly(takes, returns);
    let answer: ItemAnswer;
    try {
      answer = await this.#send('/v1/grants/batch', {
        ...(takes.length > 0 ? { takes: takes.map((t) => t.body) } : {}),
        ...(returns.length > 0 ? { returns: returns.map((r) => r.body) } : {}),
      });
    } catch {
      for (const t of takes) this.#took(t, undefined);
      for (const r of returns) this.#returned(r, undefined);
      return;
    }
    if (answer.status === 404 && answer.code === NOT_FOUND) {
      this.#single = true;
      return this.#singly(takes, returns);
    }
    const items = answer.status === 200 ? batchAnswers(answer.json, takes.length, returns.length) : undefined;
    takes.forEach((t, i) => this.#took(t, items?.takes[i]));
    returns.forEach((r, i) => this.#returned(r, items?.returns[i]));
  }

  async #singly(takes: TakeItem[], returns: ReturnItem[]): Promise<void> {
    const one = <T>(path: string, item: T & { body: object }, done: (a: ItemAnswer | undefined) => void) =>
      this.#send(path, item.body).then(done, () => done(undefined));
    await Promise.all([
      ...returns.map((r) => one('/v1/grants/return', r, (a) => this.#returned(r, a))),
      ...takes.map((t) => one('/v1/grants', t, (a) => this.#took(t, a))),
    ]);
  }

  #denial(entry: Entry, retryAfterMs: number): GrantDecision {
    const result: ClientCheckResult = {
      policy: entry.policy,
      allowed: false,
      remaining: entry.deniedRemaining,
      limit: entry.limit,
      resetMs: null,
      retryAfterMs,
    };
    if (entry.deniedReason !== undefined) result.reason = entry.deniedReason;
    const headers = denialHeaders(entry.policy, entry.deniedHeader, retryAfterMs, this.#now());
    const policyHeader = this.#policyHeaders.get(entry.policy);
    if (policyHeader !== undefined) headers['RateLimit-Policy'] = policyHeader;
    return { allowed: false, retryAfterMs, results: [result], headers, local: 'grant' };
  }

  #decision(entry: Entry): GrantDecision {
    // What this process knows: the bucket's capacity, and at least the rest of its own grant.
    const remaining = Math.floor(entry.tokens);
    const result: ClientCheckResult = {
      policy: entry.policy,
      allowed: true,
      remaining,
      limit: entry.limit,
      resetMs: null,
      retryAfterMs: 0,
    };
    const headers: Record<string, string> = { RateLimit: `"${entry.policy}";r=${remaining}` };
    const policyHeader = this.#policyHeaders.get(entry.policy);
    if (policyHeader !== undefined) headers['RateLimit-Policy'] = policyHeader;
    return { allowed: true, retryAfterMs: 0, results: [result], headers, local: 'grant' };
  }
}

/**
 * The per-item answers of a `POST /v1/grants/batch` answer, when it has one per item (`{status, body}` each, a
 * problem's `code` read out); undefined otherwise (every item then counts as unanswered).
 */
function batchAnswers(
  json: unknown,
  takes: number,
  returns: number,
): { takes: ItemAnswer[]; returns: ItemAnswer[] } | undefined {
  if (typeof json !== 'object' || json === null) return undefined;
  const side = (list: unknown, n: number): ItemAnswer[] | undefined => {
    if (!Array.isArray(list) || list.length !== n) return undefined;
    const out: ItemAnswer[] = [];
    for (const a of list as unknown[]) {
      if (typeof a !== 'object' || a === null) return undefined;
      const { status, body } = a as { status?: unknown; body?: unknown };
      if (typeof status !== 'number') return undefined;
      const code = (body as { code?: unknown } | null)?.code;
      out.push({ status, json: body, code: typeof code === 'string' ? code : undefined });
    }
    return out;
  };
  const t = side((json as { takes?: unknown }).takes, takes);
  const r = side((json as { returns?: unknown }).returns, returns);
  return t === undefined || r === undefined ? undefined : { takes: t, returns: r };
}

/**
 * A repeated denial's headers at `now`: `Retry-After` the remaining wait until the cost fits; the agent's
 * `RateLimit` item (and legacy headers) of the denial with its `r`, and its `t` counted down to the instant it
 * named. The refused bucket is not full, so a `t` is at least 1, as the agent's was.
 */
function denialHeaders(
  policy: string,
  said: DeniedHeader | undefined,
  retryAfterMs: number,
  now: number,
): Record<string, string> {
  const headers: Record<string, string> = {
    'Retry-After': String(Math.max(1, Math.ceil(retryAfterMs / 1000))),
  };
  if (said === undefined) return headers;
  const t = said.tAt === null ? undefined : Math.max(1, Math.ceil((said.tAt - now) / 1000));
  headers['RateLimit'] = `"${policy}";r=${said.r}${t === undefined ? '' : `;t=${t}`}`;
  if (said.legacyLimit !== undefined) {
    headers['X-RateLimit-Limit'] = said.legacyLimit;
    headers['X-RateLimit-Remaining'] = String(said.r);
    headers['X-RateLimit-Reset'] = String(t ?? 0);
  }
  return headers;
}

/**
 * What the agent's headers of a denial of `policy` said, to be repeated (undefined: no `RateLimit` item for it).
 * Its `t` (whole seconds, rounded up) is turned into the instant it counts down to without knowing the agent's
 * draft: the result's `resetMs` (-11: the quota restored) or `retryAfterMs` (-10: the cost fits) when its whole
 * seconds are `t`, exact; otherwise (a borrowing check's `t` is its global budget's) `t` itself, at most 1 s late.
 */
function deniedHeader(
  policy: string,
  headers: Record<string, string>,
  result: ClientCheckResult,
  now: number,
): DeniedHeader | undefined {
  const item = rateLimitItem(headers['RateLimit'], policy);
  if (item === undefined) return undefined;
  let tAt: number | null = null;
  if (item.t !== undefined) {
    const ms = [result.resetMs, result.retryAfterMs].find(
      (v) => v !== null && Math.ceil(v / 1000) === item.t,
    );
    tAt = now + (ms ?? item.t * 1000);
  }
  return { r: item.r, tAt, legacyLimit: headers['X-RateLimit-Limit'] };
}

/**
 * The `r` and `t` of `policy`'s item in a `RateLimit` header as the agent writes it
 * (core/wire/rate-limit-headers.ts: `"name";r=R` and `;t=T`, whole numbers, items joined by `, `); undefined
 * when it has none.
 */
function rateLimitItem(header: string | undefined, policy: string): { r: number; t?: number } | undefined {
  if (header === undefined) return undefined;
  const prefix = `"${policy}";`;
  for (let at = header.indexOf(prefix); at >= 0; at = header.indexOf(prefix, at + 1)) {
    if (at !== 0 && !header.startsWith(', ', at - 2)) continue;
    const m = /^r=(\d+)(?:;t=(\d+))?(?:,|$)/.exec(header.slice(at + prefix.length));
    if (m === null) continue;
    return m[2] === undefined ? { r: Number(m[1]) } : { r: Number(m[1]), t: Number(m[2]) };
  }
  return undefined;
}

/** The agent accepts the check's cost: absent (1), or a number of at least one micro-token (TokenCost). */
function validCost(body: SingleDecisionRequest): boolean {
  return body.cost === undefined || isTokenCost(body.cost);
}

/**
 * Whether `body` may be decided on a grant or teach the pool about its subject: a single check, not a dry run,
 * without an idempotency key, and without a `class` (a grant is taken at the class the policy gives the subject;
 * a check naming another would spend, or be refused on, a bucket with other limits).
 */
function grantable(body: DecisionRequest): body is SingleDecisionRequest {
  return (
    !('checks' in body) &&
    body.dryRun !== true &&
    body.idempotencyKey === undefined &&
    body.class === undefined
  );
}

function keyOf(policy: string, subject: string): string {
  return `${policy}\u0000${subject}`;
}

/** `tokens` rounded to the micro-token. */
function microTokens(tokens: number): number {
  return Math.round(tokens * 1e6) / 1e6;
}
