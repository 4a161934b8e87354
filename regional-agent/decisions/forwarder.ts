import type { CheckResult, ShedPath } from '../../core/wire/agent.js';

/** One check of a strict policy, sent to the agents of its home region. The subject is already normalized. */
export interface ForwardCheck {
  policy: string;
  subject: string;
  cost: number;
  /** The subject's class, when it has one. */
  class?: string;
}

export interface ForwardResult {
  results: CheckResult[];
  replayed?: boolean | undefined;
}

export interface ForwardRequest {
  checks: ForwardCheck[];
  idempotencyKey?: string | undefined;
  dryRun: boolean;
}

/**
 * The home region answered that it is overloaded, or a home that answers others did not answer in time: nothing
 * was decided; busy, not unreachable. `shed` says which (forward_timeout, or the home's own reason).
 */
export class HomeOverloadedError extends Error {
  readonly code = 'AGT_HOME_OVERLOADED';
  readonly homeRegion: string;
  readonly shed: ShedPath;
  constructor(homeRegion: string, shed: ShedPath, message: string) {
    super(message);
    this.name = 'HomeOverloadedError';
    this.homeRegion = homeRegion;
    this.shed = shed;
  }
}

/**
 * Strict mode's port: decide checks of policies homed in another region at that region's agents (issue 6
 * implements it over NATS request/reply). The agent sends at most one home region per request, after every
 * local check was granted, so a remote grant never needs to be taken back.
 */
export interface Forwarder {
  /**
   * Decide all-or-nothing at `homeRegion` within `budgetMs`; results in the order of `request.checks`, and
   * whether the home answered from an idempotency record (a retry). Throws when the home region gives no answer
   * in time (the policies' failure mode applies), HomeOverloadedError when the home shed the request, or
   * AGT_ERR_IDEMPOTENCY_CONFLICT.
   */
  decide(homeRegion: string, request: ForwardRequest, budgetMs: number): Promise<ForwardResult>;
  /**
   * Time a decision may wait for `homeRegion` beyond its local deadline, ms: the link's round trip and its margin
   * (core/distance.ts linkAllowanceMs). Absent: none (the home is as near as this agent's own store).
   */
  linkAllowanceMs?(homeRegion: string): number;
  /**
   * The largest `linkAllowanceMs` of any home a decision here may wait for (one the configured matrix names, one
   * `expectHomes` named, one already forwarded to; not yet measured, it counts what its forwards wait), ms: how
   * much longer than its local deadline a decision here may take (0: no home). The agent's
   * `quotaplane-answer-within-ms` header promises it, so it must never be less than a forward really waits. Read
   * on every decision request: a kept value, not a walk over the links.
   */
  farthestAllowanceMs?(): number;
  /**
   * The home regions this agent's policies may forward to now (its strict policies homed in another region),
   * told at start and after every policy change; the set replaces the last one. Each counts in
   * `farthestAllowanceMs` before its first forward, so the header already covers the first forwards to a home
   * not measured yet.
   */
  expectHomes?(homes: Iterable<string>): void;
}
