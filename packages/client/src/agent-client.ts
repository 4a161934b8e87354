/**
 * A typed client of the regional agent for services: keep-alive connections, a timeout on every call, a
 * circuit breaker (opossum) so a hung agent stops costing every request the full timeout, and the policy's
 * failure mode for every answer the agent could not give: `closed` denies, `open` admits, `local` decides on a
 * small in-process fallback bucket. Such answers say what they are (`degraded`, `failure`) and carry no numbers
 * the agent did not give. Answers the agent refuses (4xx: unknown policy, bad subject…) are programming errors
 * of the service and throw AgentRequestError.
 *
 * Load is never an agent failure. Decisions wait in the client's own bounded queue for one of `maxSockets`
 * exchanges; the decisions of one event-loop turn (or `coalesce.windowMs`) leave together as one
 * `POST /v1/decisions/batch`. The timeout runs from the moment an exchange's request was written, so time spent
 * queued or connecting never counts, and only a refused or reset connection (or one not made within the
 * timeout), a 5xx, or no answer within the timeout counts toward the breaker. A decision that finds the queue
 * full (`maxQueued`) is shed: answered by its policy's failure mode at once, with `failure: 'shed'` and reason
 * `client_shed`, counted in `stats().shed`, never in the breaker.
 */
import { Agent, request as httpRequest, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import CircuitBreaker from 'opossum';
import {
  ANSWER_WITHIN_HEADER,
  FIRST_ANSWER_WITHIN_MS,
  DecisionResponse,
  Problem,
  checksOf,
  looksValidDecisionRequest,
  readDecisionBody,
  type DecisionRequest,
  type WireCheckResult,
  LeaseReleaseResponse,
} from '../../../core/wire/agent.js';
import { ownValue, setOwn } from '../../../core/own-keys.js';
import { neverASubject } from '../../../core/subjects/subject.js';
import { BatchAnswer } from '../../../core/wire/batch.js';
import {
  ReservationResponse,
  SettlementResponse,
  type ReservationRequest,
} from '../../../core/models/reservation.js';
import { FallbackBuckets, type FallbackBucket, type FallbackCheck } from './fallback.js';
import { GrantPool, type GrantOptions, type GrantStats } from './grants.js';
import { DirectDecider, type DirectOptions, type DirectStats } from './direct.js';
import { fastAnswers, fastDecision } from './wire-check.js';

/** What a policy does when the agent cannot decide: deny, admit, or decide on the fallback bucket. */
export type FailureMode = 'closed' | 'open' | 'local';

/**
 * Why the agent gave no decision: no answer within the timeout, no connection, an overloaded agent (503
 * `AGT_ERR_OVERLOADED`), an answer that is not a decision, the breaker open (the call was not made), or the agent
 * refused the request (used by the Fastify plugin, which applies the failure mode to a refused check).
 */
export type AgentFailure =
  'timeout' | 'connection' | 'overloaded' | 'bad_status' | 'bad_body' | 'breaker_open' | 'refused';
export const AGENT_FAILURES: readonly AgentFailure[] = [
  'timeout',
  'connection',
  'overloaded',
  'bad_status',
  'bad_body',
  'breaker_open',
  'refused',
];

/** Which failure mode answered a decision the agent did not make. */
export type Degraded = 'fail_open' | 'fail_closed' | 'fallback';
export const DEGRADED: readonly Degraded[] = ['fail_open', 'fail_closed', 'fallback'];

export type BreakerState = 'closed' | 'open' | 'half_open';

/**
 * One check's decision. From the agent it is exactly the wire's (whole tokens); made by the client, `remaining`
 * and `limit` are present only when the fallback bucket decided (its own numbers), and `mode` is absent.
 */
export interface ClientCheckResult extends Omit<WireCheckResult, 'remaining' | 'limit' | 'mode'> {
  remaining?: number;
  limit?: number;
  mode?: WireCheckResult['mode'];
}

/** A decision: the agent's answer, or the failure mode's when `degraded` is set. */
export interface Decision extends Omit<DecisionResponse, 'results'> {
  results: ClientCheckResult[];
  /** Set when the agent did not decide: `fail_open`, `fail_closed`, or `fallback` (the fallback bucket decided). */
  degraded?: Degraded;
  /** Why the agent did not decide (with `degraded`): an agent failure, or `shed` (the client's queue was full). */
  failure?: AgentFailure | 'shed';
}

/** A policy's own failure handling, overriding the client's. */
export interface PolicyFailureOptions {
  onUnavailable?: FailureMode;
  fallback?: FallbackBucket;
}

export interface BreakerOptions {
  /**
   * Calls in the window before the breaker may open. Default 5. That many exchanges in a row that got no answer
   * (a timeout, a refused or reset connection), with nothing answered in between, open it too: a frozen agent
   * fails exchanges only as fast as they time out, while the good ones before it came at the pace of traffic.
   */
  volumeThreshold?: number;
  /** Failed calls, in percent of the window's calls, that open it. Default 50. */
  errorPercent?: number;
  /** How long it stays open before one probe call is let through (half-open). Default 1000 ms. */
  resetMs?: number;
  /** The rolling window the failures are counted over. Default 10 000 ms. */
  windowMs?: number;
}

export interface AgentClientOptions {
  /** The agent's base URL, e.g. `http://127.0.0.1:7101`. */
  baseUrl: string;
  /**
   * Longest wait for an exchange's answer, from the moment the request was written to its connection (time queued
   * in the client and time connecting never count; a new connection not made within it fails). Default 300 ms: longer than the agent's own decision deadline (250 ms by default,
   * `QP_DECISION_DEADLINE_MS`), so a healthy agent's slow path (borrowing from another region, a strict policy's
   * home) is an answer, not a timeout. Unset, the timeout follows the agent: every answer says how long the agent
   * may take (`quotaplane-answer-within-ms`: its deadline plus its farthest link's allowance, so a strict check
   * forwarded to a home 220 ms away may take 525 ms), and the client waits that plus 50 ms, never less than 300;
   * before its first answer, 613 ms (what the agent assumes of a far link it has not measured: 250 + 1.25 × 250,
   * plus 50). A new connection is given 300 ms. Set, it is used as given for both.
   */
  timeoutMs?: number;
  /**
   * What to answer when the agent cannot (default `closed`). Set it as the policy's `onStoreFailure` says, so a
   * policy fails the same way whether its store or its agent is down. `local` needs `fallback`.
   */
  onUnavailable?: FailureMode;
  /** Failure handling per policy name, overriding `onUnavailable` and `fallback`. */
  policies?: Readonly<Record<string, PolicyFailureOptions>>;
  /** The in-process fallback bucket of `local` policies (per subject, per process). */
  fallback?: FallbackBucket;
  /** Most fallback buckets kept (subjects × policies); new subjects beyond it fail closed. Default 10 000. */
  fallbackMaxBuckets?: number;
  /** Retry hint of a `closed` answer given for an unreachable agent. Default 1000 ms. */
  unavailableRetryAfterMs?: number;
  /** Most sockets kept open to the agent. Default 64. */
  maxSockets?: number;
  /**
   * Most exchanges with the agent in flight at once (at most `maxSockets`). While they are out, new decisions
   * gather in the queue and leave together when one returns: the busier the service, the bigger the batches.
   * With coalescing, a further exchange starts beside those in flight only when they are all slow
   * (`coalesce.slowMs`) or the queue fills a whole batch. Default 4 with coalescing, `maxSockets` without.
   */
  maxExchanges?: number;
  /**
   * Most decisions waiting in the client for an exchange; one more is shed (its policy's failure mode answers,
   * `failure: 'shed'`, counted in `stats().shed`). Default 8192.
   */
  maxQueued?: number;
  /**
   * Send the decisions of one event-loop turn (or of `windowMs`) as one `POST /v1/decisions/batch` of at most
   * `maxBatch` decisions. Default on, `windowMs` 0 (the same turn), `maxBatch` 64. `false`: one request each.
   */
  coalesce?: CoalesceOptions | false;
  /** The client-side circuit breaker; `false` turns it off (every call waits up to the timeout). */
  breaker?: BreakerOptions | false;
  /** Told about every call the agent did not answer (for the service's own metrics and logs). */
  onFailure?: (error: AgentUnavailableError) => void;
  /** Told when the breaker opens, half-opens (a probe is let through) or closes. */
  onBreakerChange?: (state: BreakerState) => void;
  /**
   * Local grants of hot subjects' tokens (grants.ts); `false` asks the agent for every decision. Default on, off
   * with `direct` (a direct decision already spends no exchange with the agent; a grant's take and return would).
   */
  grants?: GrantOptions | false;
  /**
   * Decide single checks of eligible policies in this process on the region's Redis, under terms the agent gives
   * (direct.ts; docs/agent.md, "Direct decisions"). Only for a service trusted with the region's Redis: its
   * credentials let it write any bucket. Off unless given.
   */
  direct?: DirectOptions;
}

export interface CoalesceOptions {
  /** How long a decision may wait for others to share its exchange, ms; 0: the same event-loop turn. Default 0. */
  windowMs?: number;
  /** Most decisions in one batch, 1..128. Default 64 (the agent's store decides up to 64 in one script call). */
  maxBatch?: number;
  /**
   * While an exchange is in flight, decisions wait for it to return and then leave together, unless every exchange
   * in flight has been out longer than this (ms: a slow path at the agent, such as borrowing from another region
   * or a strict policy's home) or a whole batch is waiting: then another exchange starts, up to `maxExchanges`.
   * One exchange carrying many decisions costs the service, the agent and the store less than several carrying a
   * few each. 0: start exchanges as long as fewer than `maxExchanges` are out. Default 20, at most 1000.
   */
  slowMs?: number;
}

/** Per-call options. */
export interface DecideOptions {
  requestId?: string;
  /** The failure mode for this call (for every check, or per policy), overriding the client's. */
  onUnavailable?: FailureMode | Readonly<Record<string, FailureMode>>;
}

/** What the client has counted since it was made. */
export interface ClientStats {
  breaker: BreakerState;
  /** Decisions the agent made. */
  decided: number;
  /** Calls the agent did not answer, by why. */
  failures: Record<AgentFailure, number>;
  /** Decisions made by a failure mode, by which. */
  degraded: Record<Degraded, number>;
  /** Requests the agent refused (4xx), by code. */
  refused: Record<string, number>;
  /** Decisions shed because the client's queue was full (answered by their failure mode; not agent failures). */
  shed: number;
  /** Exchanges with the agent so far, and how many of them were batches. */
  exchanges: number;
  batches: number;
  /**
   * Connections opened to the agent so far (kept alive and reused after; a busy service opens up to
   * `maxExchanges` + 1). Connecting never counts toward the timeout, which runs from the write.
   */
  connections: number;
  /** Decisions waiting in the client's queue now, and exchanges in flight now. */
  queued: number;
  inFlight: number;
  /** The timeout in force now, ms: `timeoutMs` as given, or the agent's answer bound plus 50 (at least 300). */
  timeoutMs: number;
}

/** The agent refused the request (4xx): the problem document says why. */
export class AgentRequestError extends Error {
  readonly status: number;
  readonly problem: Problem;
  readonly code: string;
  constructor(problem: Problem) {
    super(`agent refused the request: ${problem.code} ${problem.detail ?? problem.title}`);
    this.name = 'AgentRequestError';
    this.status = problem.status;
    this.problem = problem;
    this.code = problem.code;
  }
}

/** The agent gave no decision; `failure` says why. */
export class AgentUnavailableError extends Error {
  readonly failure: AgentFailure;
  /** The agent's Retry-After, when it sent one (overload). */
  readonly retryAfterMs: number | undefined;
  constructor(failure: AgentFailure, message: string, retryAfterMs?: number) {
    super(message);
    this.name = 'AgentUnavailableError';
    this.failure = failure;
    this.retryAfterMs = retryAfterMs;
  }
}

/** The client's queue was full: the decision was not sent (load on the service, not an agent failure). */
export class ClientShedError extends Error {
  readonly failure = 'shed';
  readonly retryAfterMs: number | undefined = undefined;
  /** `maxQueued`: the queue's bound it met; `closed`: the client was closed (nothing is sent any more). */
  constructor(maxQueued: number, closed = false) {
    super(
      closed
        ? 'the client is closed: this decision was shed, the agent was not asked'
        : `the client's queue holds ${maxQueued} decisions: this one was shed, the agent was not asked`,
    );
    this.name = 'ClientShedError';
  }
}

/** The timeout before the agent has said how long it may take, and the least it ever is when unset, ms. */
const DEFAULT_TIMEOUT_MS = 300;
/** Time allowed beyond the agent's own bound for its answer to travel and be read, ms. */
const ANSWER_MARGIN_MS = 50;
/** Longest agent bound the client follows, ms (a larger one is ignored, as a misconfiguration). */
const MAX_FOLLOWED_TIMEOUT_MS = 30_000;
const OVERLOADED = 'AGT_ERR_OVERLOADED';
const NOT_FOUND = 'AGT_ERR_NOT_FOUND';
/**
 * Largest batch body the client sends, bytes (the agent takes 16 times its body limit, 256 KiB by default). An
 * agent whose body limit was lowered answers a larger batch 413: the client then halves its bound, down to one
 * decision per batch, and sends the same decisions again.
 */
const MAX_BATCH_BYTES = 128 * 1024;

/** One decision waiting for (or in) an exchange. */
interface Pending {
  payload: string;
  requestId: string | undefined;
  /** When it was queued (performance.now()). */
  queuedAt: number;
  resolve: (decision: DecisionResponse) => void;
  reject: (error: unknown) => void;
}

/** One element's outcome of an exchange. */
type Outcome = { decision: DecisionResponse } | { error: AgentRequestError | AgentUnavailableError };

/** The agent has no batch route (an older agent): the exchange's decisions are sent one by one. */
class BatchUnsupported extends Error {}

/** The agent refused a batch of `size` characters as too large (413): its decisions go again in smaller batches. */
class BatchTooLarge extends Error {
  constructor(readonly size: number) {
    super(`the agent refused a batch of ${size} characters as too large`);
  }
}

interface Answer {
  status: number;
  text: string;
  retryAfter: string | undefined;
}

/** The agent's own refusal of `body` (400, as `POST /v1/decisions` words it), or undefined when it reads it. */
function bodyRefusal(input: unknown): AgentRequestError | undefined {
  let body: DecisionRequest;
  // Most bodies read as they are (every decision of an outage comes here): no JSON round trip for those.
  if (looksValidDecisionRequest(input)) body = input;
  else {
    // What the agent would read: the body as its JSON carries it (a key set to undefined dropped, NaN as null).
    let sent: unknown = input;
    try {
      const json = JSON.stringify(input) as string | undefined;
      if (json !== undefined) sent = JSON.parse(json);
    } catch {
      // Not JSON at all (a BigInt, a cycle): the body as it is, which the schema refuses.
    }
    const read = readDecisionBody(sent);
    if (!read.ok) return badRequest(read.code, read.problems);
    body = read.request;
  }
  // A subject no agent keys, however configured (control characters, a lone surrogate): the agent's 400 too.
  const problems = checksOf(body).flatMap((c) => neverASubject(c.subject) ?? []);
  return problems.length === 0 ? undefined : badRequest('AGT_ERR_INVALID_SUBJECT', problems);
}

function badRequest(code: string, problems: string[]): AgentRequestError {
  return new AgentRequestError({
    type: 'about:blank',
    title: 'Bad Request',
    status: 400,
    code,
    detail: problems.join('; '),
    errors: problems,
  });
}

/**
 * The agent's route at `path`, or a TypeError that says what `baseUrl` must be (an unset environment variable
 * reaches here as undefined, a bare host as a relative URL).
 */
function agentUrl(baseUrl: unknown, path: string): URL {
  if (typeof baseUrl !== 'string' || !URL.canParse(baseUrl)) {
    const got = typeof baseUrl === 'string' ? JSON.stringify(baseUrl.slice(0, 100)) : String(baseUrl);
    throw new TypeError(
      `AgentClient: baseUrl must be the agent's absolute URL, such as http://127.0.0.1:7101 (got ${got})`,
    );
  }
  const base = new URL(baseUrl);
  if (base.protocol !== 'http:')
    throw new TypeError(
      `AgentClient: baseUrl must be an http:// URL, the agent listening on plain http on a private network (got ${base.protocol})`,
    );
  return new URL(path, base);
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function counts<K extends string>(keys: readonly K[]): Record<K, number> {
  return Object.fromEntries(keys.map((k) => [k, 0])) as Record<K, number>;
}

function validMode(mode: FailureMode | undefined, fallback: FallbackBucket | undefined, where: string): void {
  if (mode === 'local' && fallback === undefined)
    throw new TypeError(`${where}: onUnavailable 'local' needs a fallback bucket`);
  if (fallback !== undefined && !(fallback.capacity > 0 && fallback.refillPerSecond >= 0))
    throw new TypeError(`${where}: a fallback bucket needs capacity > 0 and refillPerSecond >= 0`);
}

export class AgentClient {
  readonly #url: URL;
  readonly #agent: Agent;
  /** The timeout in force, ms: `timeoutMs` as given, or following the agent's `quotaplane-answer-within-ms`. */
  #timeoutMs: number;
  readonly #timeoutFollowsAgent: boolean;
  /** Longest wait for a new connection, ms: `timeoutMs` as given, else 300 (the agent's bound is about answers). */
  readonly #connectTimeoutMs: number;
  readonly #mode: FailureMode;
  readonly #policies: Readonly<Record<string, PolicyFailureOptions>>;
  readonly #fallbackBucket: FallbackBucket | undefined;
  readonly #fallback: FallbackBuckets;
  readonly #retryAfterMs: number;
  readonly #onFailure: ((error: AgentUnavailableError) => void) | undefined;
  readonly #batchUrl: URL;
  readonly #breaker: CircuitBreaker<[Pending[]], Outcome[]> | undefined;
  /** Exchanges in a row that got no answer (timeout, connection), and how many open the breaker. */
  #unanswered = 0;
  #openAfter = 5;
  readonly #maxInFlight: number;
  readonly #maxQueued: number;
  readonly #windowMs: number;
  readonly #slowMs: number;
  /** When each exchange in flight started (performance.now()), oldest first. */
  readonly #started: number[] = [];
  /** A pump armed for when the exchanges in flight turn slow. */
  #slowTimer: NodeJS.Timeout | undefined;
  /** When the agent last answered anything (performance.now()): an answer says it is alive, however busy. */
  #lastAnswerAt = -Infinity;
  /** When an exchange last got no answer within its timeout (performance.now()). */
  #lastTimeoutAt = -Infinity;
  /** Most decisions per exchange: 1 without coalescing, or when the agent has no batch route. */
  #maxBatch: number;
  #state: BreakerState = 'closed';
  /** Decisions waiting for an exchange, oldest first. */
  #queue: Pending[] = [];
  #inFlight = 0;
  #flushScheduled = false;
  #maxBatchBytes = MAX_BATCH_BYTES;
  readonly #grants: GrantPool | undefined;
  readonly #direct: DirectDecider | undefined;
  /** Set by the first close: settles once what closing hands back has been answered. */
  #closing: Promise<void> | undefined;
  /** Set by a close with exchanges in flight: told when the last of them returns. */
  #whenIdle: (() => void) | undefined;
  readonly #stats = {
    decided: 0,
    failures: counts(AGENT_FAILURES),
    degraded: counts(DEGRADED),
    refused: {} as Record<string, number>,
    shed: 0,
    exchanges: 0,
    batches: 0,
    connections: 0,
  };

  constructor(options: AgentClientOptions) {
    this.#url = agentUrl(options.baseUrl, '/v1/decisions');
    this.#batchUrl = agentUrl(options.baseUrl, '/v1/decisions/batch');
    // Before the agent has said its bound, assume what it assumes of a far link it has not measured yet, so the
    // first exchange of a cold burst (a strict check forwarded across a link) is not given up on.
    this.#timeoutMs = options.timeoutMs ?? FIRST_ANSWER_WITHIN_MS + ANSWER_MARGIN_MS;
    this.#timeoutFollowsAgent = options.timeoutMs === undefined;
    this.#connectTimeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#mode = options.onUnavailable ?? 'closed';
    this.#policies = options.policies ?? {};
    this.#fallbackBucket = options.fallback;
    validMode(this.#mode, this.#fallbackBucket, 'AgentClient');
    for (const [name, p] of Object.entries(this.#policies))
      validMode(p.onUnavailable, p.fallback ?? this.#fallbackBucket, `policy ${name}`);
    this.#fallback = new FallbackBuckets(options.fallbackMaxBuckets ?? 10_000);
    this.#retryAfterMs = options.unavailableRetryAfterMs ?? 1000;
    this.#onFailure = options.onFailure;
    const maxSockets = options.maxSockets ?? 64;
    const coalesce = options.coalesce === false ? undefined : (options.coalesce ?? {});
    this.#maxInFlight = Math.min(
      maxSockets,
      options.maxExchanges ?? (coalesce === undefined ? maxSockets : 4),
    );
    this.#maxQueued = options.maxQueued ?? 8192;
    this.#windowMs = coalesce?.windowMs ?? 0;
    this.#slowMs = coalesce === undefined ? 0 : (coalesce.slowMs ?? 20);
    this.#maxBatch = coalesce === undefined ? 1 : (coalesce.maxBatch ?? 64);
    if (!(Number.isInteger(this.#maxInFlight) && this.#maxInFlight >= 1))
      throw new TypeError('AgentClient: maxSockets and maxExchanges must be integers >= 1');
    if (!(Number.isInteger(this.#maxQueued) && this.#maxQueued >= 0))
      throw new TypeError('AgentClient: maxQueued must be an integer >= 0');
    if (!(Number.isInteger(this.#maxBatch) && this.#maxBatch >= 1 && this.#maxBatch <= 128))
      throw new TypeError('AgentClient: coalesce.maxBatch must be an integer from 1 to 128');
    if (!(this.#windowMs >= 0 && this.#windowMs <= 1000))
      throw new TypeError('AgentClient: coalesce.windowMs must be from 0 to 1000');
    if (!(this.#slowMs >= 0 && this.#slowMs <= 1000))
      throw new TypeError('AgentClient: coalesce.slowMs must be from 0 to 1000');
    // One socket more than exchanges: calls of other routes (leases, reservations) never wait behind decisions.
    this.#agent = new Agent({
      keepAlive: true,
      maxSockets: Math.max(maxSockets, this.#maxInFlight + 1),
      scheduling: 'lifo',
    });
    const postJson = async (path: string, body: unknown) => {
      const answer = await this.#post(JSON.stringify(body), undefined, 'POST', new URL(path, this.#url));
      const json = parseJson(answer.text);
      const problem = Problem.safeParse(json);
      return { status: answer.status, json, code: problem.success ? problem.data.code : undefined };
    };
    const grants = options.grants ?? (options.direct === undefined ? {} : false);
    if (grants !== false) this.#grants = new GrantPool(postJson, grants);
    if (options.direct !== undefined)
      this.#direct = new DirectDecider((body) => postJson('/v1/terms', body), options.direct);
    if (options.breaker !== false) {
      const b = options.breaker ?? {};
      this.#openAfter = b.volumeThreshold ?? 5;
      this.#breaker = new CircuitBreaker((batch: Pending[]) => this.#exchange(batch), {
        // Calls time themselves (the socket is destroyed at the timeout); opossum only counts.
        timeout: false,
        volumeThreshold: b.volumeThreshold ?? 5,
        errorThresholdPercentage: b.errorPercent ?? 50,
        resetTimeout: b.resetMs ?? 1000,
        rollingCountTimeout: b.windowMs ?? 10_000,
        rollingCountBuckets: 10,
        // An overloaded agent answered at once, and an agent without the batch route answered too: neither is
        // a reason to stop asking. (Refusals are per decision, never an exchange's error.)
        errorFilter: (error: unknown) =>
          error instanceof BatchUnsupported ||
          error instanceof BatchTooLarge ||
          (error instanceof AgentUnavailableError && error.failure === 'overloaded'),
      });
      const changed = (state: BreakerState) => () => {
        this.#state = state;
        options.onBreakerChange?.(state);
      };
      this.#breaker.on('open', changed('open'));
      this.#breaker.on('halfOpen', changed('half_open'));
      this.#breaker.on('close', changed('closed'));
    }
  }

  /** The breaker's state now (`closed` when it is turned off). */
  get breakerState(): BreakerState {
    return this.#state;
  }

  /** What local grants did since the client was made (undefined when they are off). */
  grantStats(): GrantStats | undefined {
    return this.#grants?.stats();
  }

  /** What direct decisions did since the client was made (undefined when they are off). */
  directStats(): DirectStats | undefined {
    return this.#direct?.stats();
  }

  /** Counts since the client was made. */
  stats(): ClientStats {
    return {
      breaker: this.#state,
      decided: this.#stats.decided,
      failures: { ...this.#stats.failures },
      degraded: { ...this.#stats.degraded },
      refused: { ...this.#stats.refused },
      shed: this.#stats.shed,
      exchanges: this.#stats.exchanges,
      batches: this.#stats.batches,
      connections: this.#stats.connections,
      queued: this.#queue.length,
      inFlight: this.#inFlight,
      timeoutMs: this.#timeoutMs,
    };
  }

  /**
   * Ask for a decision. Never throws for an agent that cannot answer (the failure mode answers, `degraded`
   * set); throws AgentRequestError when the agent refuses the request (4xx).
   */
  decide(body: DecisionRequest, options: DecideOptions = {}): Promise<Decision> {
    // Not async (one promise fewer per decision), so anything thrown here is turned into a rejection by hand.
    try {
      const decision = this.decideInline(body, options);
      return decision instanceof Promise ? decision : Promise.resolve(decision);
    } catch (error) {
      return Promise.reject(error instanceof Error ? error : new Error(String(error)));
    }
  }

  /**
   * As `decide`, but a decision this process makes with no call (a grant's tokens, tokens taken ahead, a refusal
   * remembered) comes as it is, not in a promise: two promises and a turn of the microtask queue fewer per such
   * decision (the Fastify plugin uses it). What would reject `decide`'s promise may throw here.
   */
  decideInline(body: DecisionRequest, options: DecideOptions = {}): Decision | Promise<Decision> {
    const local = this.#grants?.trySpend(body);
    if (local !== undefined) return local;
    const direct = this.#direct?.decide(body);
    if (direct === undefined) return this.#atAgent(body, options);
    if (!(direct instanceof Promise)) return direct;
    return direct.then((decided) => decided ?? this.#atAgent(body, options));
  }

  /** `decide` at the agent: its answer, or the failure mode's. */
  async #atAgent(body: DecisionRequest, options: DecideOptions): Promise<Decision> {
    try {
      // A body that is no JSON value (a function, a `toJSON` that returns nothing) has no payload to queue: refused
      // here, its caller's alone (queued, it would throw in the pump and stop every decision behind it).
      const payload = JSON.stringify(body) as string | undefined;
      if (payload === undefined)
        throw bodyRefusal(body) ?? badRequest('AGT_ERR_INVALID_REQUEST', ['body: not a JSON value']);
      const answer = await this.#send(payload, options.requestId);
      this.#stats.decided++;
      this.#grants?.observe(body, answer);
      return answer;
    } catch (error) {
      // A body the agent would refuse (a cost or subject from the caller) is refused here too when the agent did not
      // answer: a failure mode answers only what the agent could have decided.
      const refusal = error instanceof AgentRequestError ? error : bodyRefusal(body);
      if (refusal !== undefined) {
        setOwn(this.#stats.refused, refusal.code, (ownValue(this.#stats.refused, refusal.code) ?? 0) + 1);
        throw refusal;
      }
      if (error instanceof ClientShedError) {
        this.#stats.shed++;
        return this.#failureDecision(body, error, options.onUnavailable);
      }
      const unavailable =
        error instanceof AgentUnavailableError
          ? error
          : (error as { code?: unknown }).code === 'EOPENBREAKER'
            ? new AgentUnavailableError('breaker_open', 'the client breaker is open: the agent was not asked')
            : new AgentUnavailableError('connection', (error as Error).message);
      this.#stats.failures[unavailable.failure]++;
      this.#onFailure?.(unavailable);
      return this.#failureDecision(body, unavailable, options.onUnavailable);
    }
  }

  /** Shorthand for one check. */
  check(policy: string, subject: string, cost?: number): Promise<Decision> {
    return this.decide(cost === undefined ? { policy, subject } : { policy, subject, cost });
  }

  /**
   * The failure modes' answer to `body` for a decision the agent did not make (`failure` says why), as `decide`
   * gives it: each check by its policy's mode (or `override`), all-or-nothing.
   */
  failureDecision(
    body: DecisionRequest,
    failure: AgentUnavailableError | ClientShedError,
    override?: DecideOptions['onUnavailable'],
  ): Decision {
    const refusal = bodyRefusal(body);
    if (refusal !== undefined) throw refusal;
    return this.#failureDecision(body, failure, override);
  }

  /** `failureDecision` for a body already read as one the agent would decide. */
  #failureDecision(
    body: DecisionRequest,
    failure: AgentUnavailableError | ClientShedError,
    override?: DecideOptions['onUnavailable'],
  ): Decision {
    const checks = checksOf(body);
    const retryAfterMs = failure.retryAfterMs ?? this.#retryAfterMs;
    const reason = failure instanceof ClientShedError ? 'client_shed' : 'agent_unreachable';
    const results: ClientCheckResult[] = [];
    const local: { at: number; check: FallbackCheck }[] = [];
    let closed = false;
    checks.forEach((c, at) => {
      const mode =
        typeof override === 'string' ? override : (ownValue(override, c.policy) ?? this.#modeOf(c.policy));
      const bucket = ownValue(this.#policies, c.policy)?.fallback ?? this.#fallbackBucket;
      if (mode === 'local' && bucket !== undefined) {
        local.push({ at, check: { policy: c.policy, subject: c.subject, cost: c.cost ?? 1, bucket } });
        results[at] = { policy: c.policy, allowed: false, resetMs: null, retryAfterMs: 0 };
      } else if (mode === 'open') {
        results[at] = {
          policy: c.policy,
          allowed: true,
          resetMs: null,
          retryAfterMs: 0,
          reason,
        };
      } else {
        closed = true;
        results[at] = {
          policy: c.policy,
          allowed: false,
          resetMs: null,
          retryAfterMs,
          reason,
        };
      }
    });
    let allowed = !closed;
    if (local.length > 0) {
      // A closed check denies the request: the fallback buckets are only looked at, not charged.
      const decision = this.#fallback.decide(
        local.map((l) => l.check),
        body.dryRun === true || closed,
      );
      local.forEach((l, j) => {
        const b = decision?.results[j];
        if (decision === undefined || b === undefined) {
          // The fallback table is full: this subject fails closed.
          closed = true;
          results[l.at] = {
            policy: l.check.policy,
            allowed: false,
            resetMs: null,
            retryAfterMs,
            reason,
          };
          return;
        }
        results[l.at] = {
          policy: l.check.policy,
          allowed: false,
          remaining: b.remaining > 0 ? Math.floor(b.remaining) : 0,
          limit: Math.floor(l.check.bucket.capacity),
          resetMs: b.resetMs,
          retryAfterMs: b.retryAfterMs,
          reason: 'emergency_bucket',
        };
      });
      allowed = !closed && decision !== undefined && decision.allowed;
    }
    let wait: number | null = 0;
    for (const r of results) {
      r.allowed = allowed;
      if (allowed || r.retryAfterMs === 0) continue;
      wait = wait === null || r.retryAfterMs === null ? null : Math.max(wait, r.retryAfterMs);
    }
    const degraded: Degraded = closed ? 'fail_closed' : local.length > 0 ? 'fallback' : 'fail_open';
    this.#stats.degraded[degraded]++;
    const headers: Record<string, string> =
      !allowed && wait !== null ? { 'Retry-After': String(Math.max(1, Math.ceil(wait / 1000))) } : {};
    return {
      allowed,
      retryAfterMs: allowed ? 0 : wait,
      results,
      headers,
      degraded,
      failure: failure.failure,
    };
  }

  /** Close the kept-alive sockets and stop the breaker's and the fallback's timers. Queued decisions are shed. */
  close(): void {
    void this.#close();
  }

  /**
   * close(), and settle once what closing hands back has been answered: tokens direct decisions took ahead and did
   * not spend (on the region's Redis: close that client after this), and local grants' returns to the agent.
   */
  closeAndDrain(): Promise<void> {
    return this.#close();
  }

  #close(): Promise<void> {
    if (this.#closing !== undefined) return this.#closing;
    const queued = this.#queue;
    this.#queue = [];
    clearTimeout(this.#slowTimer);
    this.#slowTimer = undefined;
    for (const p of queued) p.reject(new ClientShedError(this.#maxQueued, true));
    this.#breaker?.shutdown();
    this.#fallback.close();
    const direct = this.#direct?.close();
    const grants = this.#grants?.close();
    // Exchanges in flight are answered (each within its timeout) before the sockets go: destroyed under them, their
    // decisions, which the agent is deciding and charging, were answered by the failure mode as `connection`
    // failures (counted, told to onFailure) though only this client was closing.
    const idle =
      this.#inFlight === 0 ? undefined : new Promise<void>((resolve) => (this.#whenIdle = resolve));
    const answered = Promise.all([grants, idle]);
    void answered.finally(() => this.#agent.destroy());
    this.#closing = Promise.all([direct, answered]).then(() => undefined);
    return this.#closing;
  }

  #modeOf(policy: string): FailureMode {
    return ownValue(this.#policies, policy)?.onUnavailable ?? this.#mode;
  }

  /**
   * The one place a decision leaves for the agent: queued (bounded: a full queue sheds it), then sent in the next
   * exchange with room, alone or in a batch with the decisions queued beside it. Resolves with the agent's
   * decision; rejects with AgentRequestError (refused), AgentUnavailableError (no decision) or ClientShedError.
   */
  #send(payload: string, requestId: string | undefined): Promise<DecisionResponse> {
    // Closed: nothing is sent (its sockets are gone); shed, as the decisions queued at close were, never counted
    // as an agent failure.
    if (this.#closing !== undefined) return Promise.reject(new ClientShedError(this.#maxQueued, true));
    if (this.#queue.length >= this.#maxQueued) return Promise.reject(new ClientShedError(this.#maxQueued));
    return new Promise<DecisionResponse>((resolve, reject) => {
      this.#queue.push({ payload, requestId, queuedAt: performance.now(), resolve, reject });
      if (this.#flushScheduled) return;
      this.#flushScheduled = true;
      if (this.#windowMs > 0) setTimeout(this.#flush, this.#windowMs);
      else setImmediate(this.#flush);
    });
  }

  readonly #flush = (): void => {
    this.#flushScheduled = false;
    this.#pump();
  };

  /**
   * Start exchanges while decisions wait and fewer than `maxExchanges` are in flight: the first at once, a further
   * one only when a whole batch waits or every exchange in flight has been out `slowMs` (else a pump is armed for
   * then, and an exchange that returns first takes the queue with it).
   */
  #pump(): void {
    this.#expireQueued();
    while (this.#queue.length > 0 && this.#inFlight < this.#maxInFlight) {
      const now = performance.now();
      if (this.#inFlight > 0 && this.#slowMs > 0 && this.#queue.length < this.#maxBatch) {
        const newest = this.#started[this.#started.length - 1]!;
        const wait = newest + this.#slowMs - now;
        if (wait > 0) {
          if (this.#slowTimer === undefined) {
            this.#slowTimer = setTimeout(this.#slowPump, Math.ceil(wait));
            this.#slowTimer.unref();
          }
          return;
        }
      }
      let bytes = 0;
      let n = 0;
      while (n < this.#queue.length && n < this.#maxBatch) {
        bytes += this.#queue[n]!.payload.length + 1;
        if (n > 0 && bytes > this.#maxBatchBytes) break;
        n++;
      }
      const batch = this.#queue.splice(0, n);
      this.#inFlight++;
      this.#started.push(now);
      void this.#dispatch(batch).finally(() => {
        this.#inFlight--;
        this.#started.splice(this.#started.indexOf(now), 1);
        if (this.#inFlight === 0) this.#whenIdle?.();
        this.#pump();
      });
    }
  }

  /**
   * Decisions queued behind an exchange that then got no answer within its timeout, while the agent answered
   * nothing at all since they were queued (frozen, or a network dropping packets), are answered by their failure
   * mode with that exchange's decisions, as `timeout`, instead of being sent after it and waiting a timeout more.
   * Not an exchange: the breaker does not count them. The exchange's own timeout is what decides (counted from its
   * write, and re-armed when this process, not the agent, was stalled), so a stalled event loop or a slow
   * connection never fails a queued decision. While the agent answers anything, however slowly, the queue waits;
   * `maxQueued` bounds it.
   */
  #expireQueued(): void {
    let n = 0;
    for (const p of this.#queue) {
      if (p.queuedAt > this.#lastTimeoutAt || this.#lastAnswerAt >= p.queuedAt) break;
      n++;
    }
    if (n === 0) return;
    const error = new AgentUnavailableError(
      'timeout',
      'an exchange ahead of this decision got no answer from the agent within the timeout, and nothing else did',
    );
    for (const p of this.#queue.splice(0, n)) p.reject(error);
  }

  readonly #slowPump = (): void => {
    this.#slowTimer = undefined;
    this.#pump();
  };

  /** One exchange (through the breaker): each decision of `batch` is settled with its own outcome. */
  async #dispatch(batch: Pending[]): Promise<void> {
    let outcomes: Outcome[];
    try {
      outcomes = this.#breaker === undefined ? await this.#exchange(batch) : await this.#breaker.fire(batch);
    } catch (error) {
      if (error instanceof BatchUnsupported || error instanceof BatchTooLarge) {
        if (error instanceof BatchUnsupported) {
          // An agent older than the batch route: from now on one decision per exchange.
          this.#maxBatch = 1;
        } else {
          // An agent with a lowered body limit: batches of at most half this one from now on, in the pump's own
          // measure (characters, whatever their bytes), so each refusal makes the next batch smaller, down to one
          // decision alone, which goes to the single route and answers its own 413 if even that is too large.
          this.#maxBatchBytes = Math.min(this.#maxBatchBytes, Math.floor(error.size / 2));
        }
        // These go again first, unless the client closed meanwhile (it sheds what it holds).
        if (this.#closing === undefined) this.#queue.unshift(...batch);
        else for (const p of batch) p.reject(new ClientShedError(this.#maxQueued, true));
        return;
      }
      if (error instanceof AgentUnavailableError && error.failure === 'timeout')
        this.#lastTimeoutAt = performance.now();
      // No answer at all, again: that many in a row open the breaker. Anything the agent answered (a 5xx, an
      // overload) breaks the row, as an answered exchange does.
      if (
        error instanceof AgentUnavailableError &&
        (error.failure === 'timeout' || error.failure === 'connection')
      ) {
        if (++this.#unanswered >= this.#openAfter && this.#state === 'closed') this.#breaker?.open();
      } else this.#unanswered = 0;
      for (const p of batch) p.reject(error);
      return;
    }
    this.#unanswered = 0;
    batch.forEach((p, i) => {
      const o = outcomes[i]!;
      if ('decision' in o) p.resolve(o.decision);
      else p.reject(o.error);
    });
  }

  /**
   * Send `batch` (one decision to `POST /v1/decisions`, more to the batch route) and read each decision's outcome.
   * Throws when the exchange as a whole got no answer (timeout, connection, 5xx, overloaded, a body that is not
   * an answer): what the breaker counts.
   */
  async #exchange(batch: readonly Pending[]): Promise<Outcome[]> {
    this.#stats.exchanges++;
    if (batch.length === 1) {
      const only = batch[0]!;
      const answer = await this.#post(only.payload, only.requestId);
      return [this.#outcome(answer.status, parseJson(answer.text), answer.retryAfter, true)];
    }
    this.#stats.batches++;
    const payload = `{"decisions":[${batch.map((p) => p.payload).join(',')}]}`;
    const answer = await this.#post(payload, batch[0]!.requestId, 'POST', this.#batchUrl);
    const json = parseJson(answer.text);
    if (answer.status !== 200) {
      const problem = Problem.safeParse(json);
      if (answer.status === 404 && problem.success && problem.data.code === NOT_FOUND) {
        throw new BatchUnsupported('the agent has no batch route');
      }
      if (answer.status === 413) throw new BatchTooLarge(payload.length);
      // The exchange as a whole was not answered (overloaded, 5xx) or refused (a 4xx of the batch itself).
      const whole = this.#outcome(answer.status, json, answer.retryAfter, true);
      if ('error' in whole && whole.error instanceof AgentUnavailableError) throw whole.error;
      // Refused whole: the batch is made of bodies each sent alone too, so one of them made the whole unreadable to
      // the agent (a `__proto__` key, which its JSON parser refuses). Each decision goes again alone: a refusal is
      // its own caller's, never its neighbours'.
      return this.#alone(batch);
    }
    const fast = fastAnswers(json, batch.length);
    // The fast check passed every 200 element's decision already: only the problem elements are read again. A
    // problem element's `retryAfter` is the Retry-After its own exchange would have carried: read as that header.
    if (fast !== undefined)
      return fast.map((a) =>
        a.status === 200
          ? { decision: a.body as DecisionResponse }
          : this.#outcome(a.status, a.body, 'retryAfter' in a ? a.retryAfter : undefined, false),
      );
    // Read per element: one element that is not an answer (a reason a newer agent knows, a broken body) is its
    // own decision's `bad_body`, never its neighbours'. Only an answer that is not a list of one answer per
    // decision fails the exchange.
    const answers =
      typeof json === 'object' && json !== null ? (json as { answers?: unknown }).answers : undefined;
    if (!Array.isArray(answers) || answers.length !== batch.length) {
      throw new AgentUnavailableError('bad_body', 'unexpected batch body');
    }
    return answers.map((element: unknown): Outcome => {
      const a = BatchAnswer.safeParse(element);
      if (!a.success)
        return {
          error: new AgentUnavailableError('bad_body', `unexpected batch answer: ${a.error.message}`),
        };
      return this.#outcome(
        a.data.status,
        a.data.body,
        'retryAfter' in a.data ? a.data.retryAfter : undefined,
        false,
      );
    });
  }

  /** Each decision of a batch the agent refused whole, sent on its own: its own outcome, an error included. */
  #alone(batch: readonly Pending[]): Promise<Outcome[]> {
    this.#stats.exchanges += batch.length;
    return Promise.all(
      batch.map(async (p): Promise<Outcome> => {
        try {
          const answer = await this.#post(p.payload, p.requestId);
          return this.#outcome(answer.status, parseJson(answer.text), answer.retryAfter, false);
        } catch (error) {
          return {
            error:
              error instanceof AgentUnavailableError
                ? error
                : new AgentUnavailableError('connection', String(error)),
          };
        }
      }),
    );
  }

  /**
   * One decision's outcome from its status, body and Retry-After (the header of its own exchange, or its batch
   * element's `retryAfter`: whole seconds either way); an exchange-level failure when `whole` and no decision.
   */
  #outcome(status: number, json: unknown, retryAfter: string | number | undefined, whole: boolean): Outcome {
    if (status === 200) {
      const fast = fastDecision(json);
      if (fast !== undefined) return { decision: fast };
      const parsed = DecisionResponse.safeParse(json);
      if (parsed.success) return { decision: parsed.data };
      const error = new AgentUnavailableError(
        'bad_body',
        `unexpected decision body: ${parsed.error.message}`,
      );
      if (whole) throw error;
      return { error };
    }
    const problem = Problem.safeParse(json);
    if (status === 503 && problem.success && problem.data.code === OVERLOADED) {
      const seconds = Number(retryAfter);
      const error = new AgentUnavailableError(
        'overloaded',
        'the agent is overloaded: nothing was decided',
        Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : undefined,
      );
      if (whole) throw error;
      return { error };
    }
    if (status >= 400 && status < 500 && problem.success)
      return { error: new AgentRequestError(problem.data) };
    const error = new AgentUnavailableError('bad_status', `agent answered ${status}`);
    if (whole) throw error;
    return { error };
  }

  /**
   * Release the slots a `concurrency` check acquired: `lease` is the token its result carried. Idempotent:
   * `released` is false when they were already released or the lease ran out. Throws AgentRequestError when
   * the agent refuses (a bad token, a lease of another region) and AgentUnavailableError when it cannot answer;
   * a lease never released comes back by itself after the policy's `leaseSeconds`.
   */
  async releaseLease(lease: string): Promise<LeaseReleaseResponse> {
    return this.#other('DELETE', `/v1/leases/${encodeURIComponent(lease)}`, undefined, LeaseReleaseResponse);
  }

  /**
   * Reserve `amount` before irreversible work (`POST /v1/reservations`): a decision; when admitted,
   * `reservation.id` is what `commitReservation` and `cancelReservation` take. Not retried and no failure mode:
   * an agent that cannot answer throws AgentUnavailableError (a reservation whose answer was lost is refunded
   * whole when it expires).
   */
  async reserve(body: ReservationRequest): Promise<ReservationResponse> {
    return this.#other('POST', '/v1/reservations', body, ReservationResponse);
  }

  /** Commit what was used (`0..amount`); the rest is refunded. Idempotent (`replayed` on a repeat). */
  async commitReservation(id: string, amount: number): Promise<SettlementResponse> {
    return this.#other(
      'POST',
      `/v1/reservations/${encodeURIComponent(id)}/commit`,
      { amount },
      SettlementResponse,
    );
  }

  /** Cancel: everything reserved is refunded. Idempotent. */
  async cancelReservation(id: string): Promise<SettlementResponse> {
    return this.#other('DELETE', `/v1/reservations/${encodeURIComponent(id)}`, undefined, SettlementResponse);
  }

  /** A call to another route than decisions: no breaker, no failure mode; the answer parsed by `schema`. */
  async #other<T>(
    method: string,
    path: string,
    body: unknown,
    schema: { safeParse(v: unknown): { success: true; data: T } | { success: false; error: Error } },
  ): Promise<T> {
    const payload = body === undefined ? '' : JSON.stringify(body);
    const { status, text } = await this.#post(payload, undefined, method, new URL(path, this.#url));
    const json = parseJson(text);
    if (status >= 200 && status < 300) {
      const parsed = schema.safeParse(json);
      if (parsed.success) return parsed.data;
      throw new AgentUnavailableError('bad_body', `unexpected body: ${parsed.error.message}`);
    }
    const problem = Problem.safeParse(json);
    if (status >= 400 && status < 500 && problem.success) throw new AgentRequestError(problem.data);
    if (status === 503 && problem.success) {
      throw new AgentUnavailableError(
        problem.data.code === OVERLOADED ? 'overloaded' : 'bad_status',
        `${problem.data.code}: ${problem.data.detail ?? problem.data.title}`,
      );
    }
    throw new AgentUnavailableError('bad_status', `agent answered ${status}`);
  }

  /** Keep the timeout above how long the agent says it may take to answer (its header; ignored when not a whole ms). */
  #followAgent(header: string | string[] | undefined): void {
    if (typeof header !== 'string') return;
    const within = Number(header);
    if (!Number.isInteger(within) || within < 0 || within > MAX_FOLLOWED_TIMEOUT_MS) return;
    this.#timeoutMs = Math.max(DEFAULT_TIMEOUT_MS, within + ANSWER_MARGIN_MS);
  }

  #post(payload: string, requestId: string | undefined, method = 'POST', url = this.#url): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string | number> = {
        'content-length': Buffer.byteLength(payload),
      };
      if (payload.length > 0) headers['content-type'] = 'application/json';
      if (requestId !== undefined) headers['x-request-id'] = requestId;
      const req = httpRequest(url, { method, agent: this.#agent, headers }, (res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          settled = true;
          clearTimeout(timer);
          this.#lastAnswerAt = performance.now();
          const retryAfter = res.headers['retry-after'];
          if (this.#timeoutFollowsAgent) this.#followAgent(res.headers[ANSWER_WITHIN_HEADER]);
          resolve({
            status: res.statusCode ?? 0,
            text: Buffer.concat(chunks).toString('utf8'),
            retryAfter: typeof retryAfter === 'string' ? retryAfter : undefined,
          });
        });
        res.on('error', reject);
      });
      // The timeout runs from the write: the moment the request was handed to a connected socket. Time it waited
      // for a socket is not the agent's, and neither is a new connection's wait for this process to take its
      // completion: a service flooded by a burst takes the completion (and so writes) hundreds of milliseconds late,
      // though the kernel connected at once. A connection still unmade after the timeout fails (`connection`), so an
      // unreachable agent costs at most one timeout to connect; a refused one fails at once. When a timer fires,
      // what this process has already received is handled first (a busy event loop runs timers before the I/O that
      // arrived meanwhile), and a timer that fires late by more than half the timeout (this process was stalled,
      // not the agent) is armed once more: only an answer, or a connection, the agent did not give in time fails.
      let timer: NodeJS.Timeout | undefined;
      let settled = false;
      const arm = (phase: 'connect' | 'answer', rearmed = false) => {
        clearTimeout(timer);
        const waitMs = phase === 'connect' ? this.#connectTimeoutMs : this.#timeoutMs;
        const due = performance.now() + waitMs;
        timer = setTimeout(() => {
          if (!rearmed && performance.now() - due > waitMs / 2) {
            arm(phase, true);
            return;
          }
          setImmediate(() => {
            if (settled || (phase === 'connect' && req.socket?.connecting !== true)) return;
            req.destroy(
              phase === 'connect'
                ? new AgentUnavailableError('connection', `no connection to the agent within ${waitMs} ms`)
                : new AgentUnavailableError('timeout', `no answer from the agent within ${waitMs} ms`),
            );
          });
        }, waitMs);
      };
      // Handed to a connected socket (a kept-alive one now, a new one once connected), the answer's timer runs: from
      // then until the write is flushed (`finish` arms it again), so a peer that stops reading (frozen, its window
      // full) fails within the timeout too, and never holds the exchange for good.
      req.once('socket', (socket: Socket) => {
        if (!socket.connecting) {
          arm('answer');
          return;
        }
        this.#stats.connections++;
        arm('connect');
        socket.once('connect', () => {
          if (!settled && !req.writableFinished) arm('answer');
        });
      });
      // `finish`: the request was handed to the connected socket (after the connection, for a new one).
      req.once('finish', () => {
        if (!settled) arm('answer');
      });
      req.on('error', (error) => {
        settled = true;
        clearTimeout(timer);
        reject(
          error instanceof AgentUnavailableError
            ? error
            : new AgentUnavailableError('connection', error.message),
        );
      });
      req.end(payload);
    });
  }
}
