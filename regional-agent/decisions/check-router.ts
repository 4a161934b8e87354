import { createHash } from 'node:crypto';
import { checksOf, type DecisionRequest } from '../../core/wire/agent.js';
import { dailyKey } from '../../core/models/daily-budget.js';
import { ipPrefixesOf, ipSubject } from '../../core/subjects/ip-subject.js';
import { bucketKey, shardKey } from '../../core/keys.js';
import { hasOwnKey, ownValue } from '../../core/own-keys.js';
import { kindOf } from '../../core/kinds/index.js';
import { withClass, type Policy } from '../../core/policy/policy.js';
import type { PolicySource } from '../policies/policy-source.js';
import { slidingLogKey } from '../../core/models/sliding-log.js';
import type { RegionalShare, ShareView } from '../../core/shares/shares.js';
import { normalizeSubject } from '../../core/subjects/subject.js';
import { ANONYMOUS_SUBJECT } from '../../core/models/subject-creation.js';
import { AgentErrors, withProblems } from '../errors.js';
import type { PreparedCheck, PreparedRequest } from './prepared.js';

export interface CheckRouterConfig {
  region: string;
  hmacSecret?: string | undefined;
  /** True when strict checks homed elsewhere can be forwarded (a forwarder is configured). */
  canForward: boolean;
  /** Epoch ms by the agent's clock: which calendar day a daily budget's boundaries are computed around. */
  now: () => number;
  /** [0, 1): which shard of a sharded policy a check lands on. */
  random: () => number;
}

const FULL_SHARE: RegionalShare = Object.freeze({ share: 1, epoch: 0 });

/**
 * Turns a validated request into routed checks: looks up each policy, normalizes the subject (an `ip` policy's
 * to the canonical prefix of its address first), refuses costs the policy never allows, and says who decides
 * each check — this region's store (with the bucket sized from its share), the home region (strict), or the
 * failure mode (no lease, no way home).
 */
export class CheckRouter {
  readonly #policies: PolicySource;
  readonly #shares: ShareView;
  readonly #config: CheckRouterConfig;

  constructor(policies: PolicySource, shares: ShareView, config: CheckRouterConfig) {
    this.#policies = policies;
    this.#shares = shares;
    this.#config = config;
  }

  /**
   * Route every check of a request. Throws an agent error listing what is wrong; changes nothing. `repeats[i]`:
   * how many requests check `i` stands for (Envoy descriptors naming one bucket, merged into one check of their
   * summed cost), each of which may cost up to the policy's `maxCost`.
   */
  prepare(request: DecisionRequest, repeats?: readonly number[]): PreparedRequest {
    const policies = this.#policies.current();
    const wire = checksOf(request);
    const out: PreparedCheck[] = [];
    let unknown: string[] | undefined;
    let badSubjects: string[] | undefined;
    let tooCostly: { cost: number; policy: Policy }[] | undefined;
    wire.forEach((c, i) => {
      const named = policies.get(c.policy);
      // An ip policy's subject is the canonical prefix of the address sent, before classes and hashing see it.
      const ip = named?.subjectKind === 'ip' ? ipSubject(c.subject, ipPrefixesOf(named)) : undefined;
      const raw = ip?.ok === true ? ip.subject : c.subject;
      const subjectClass = named === undefined ? undefined : classOf(named, raw, c.class);
      const policy = named === undefined ? undefined : withClass(named, subjectClass);
      const subject =
        ip?.ok === false
          ? { ok: false as const, reason: `${c.policy} counts clients by IP address: ${ip.reason}` }
          : normalizeSubject(raw, { hmacSecret: this.#config.hmacSecret });
      const cost = c.cost ?? 1;
      if (policy === undefined) (unknown ??= []).push(c.policy);
      else if (cost > policy.maxCost * (repeats?.[i] ?? 1)) (tooCostly ??= []).push({ cost, policy });
      else if (kindOf(policy.kind).wholeUnits && !Number.isInteger(cost)) {
        throw new AgentErrors.AGT_ERR_INVALID_COST(
          `${policy.name} is a ${policy.kind.replace('_', ' ')} policy, which counts whole units: cost ${cost} is not an integer`,
        );
      }
      if (!subject.ok) {
        (badSubjects ??= []).push(wire.length > 1 ? `checks.${i}: ${subject.reason}` : subject.reason);
      }
      if (policy !== undefined && subject.ok)
        out.push(this.route(policy, subject.subject, cost, subjectClass, request.idempotencyKey));
    });
    if (unknown !== undefined) {
      throw withProblems(
        new AgentErrors.AGT_ERR_UNKNOWN_POLICY(unknown.join(', ')),
        unknown.map((p) => `unknown policy ${p}`),
      );
    }
    if (badSubjects !== undefined) {
      throw withProblems(new AgentErrors.AGT_ERR_INVALID_SUBJECT(badSubjects.join('; ')), badSubjects);
    }
    const [first] = tooCostly ?? [];
    if (tooCostly !== undefined && first !== undefined) {
      throw withProblems(
        new AgentErrors.AGT_ERR_COST_ABOVE_MAX(first.cost, first.policy.name, first.policy.maxCost),
        tooCostly.map((t) => `${t.cost} > maxCost ${t.policy.maxCost} of ${t.policy.name}`),
      );
    }
    if (out.length > 1) assertOneRequest(out);
    return { checks: out, idempotencyKey: request.idempotencyKey, dryRun: request.dryRun === true };
  }

  /**
   * Who decides one check of `policy` (as the subject's class sees it: `withClass`) for a normalized subject,
   * and against which bucket.
   */
  route(
    policy: Policy,
    subject: string,
    cost: number,
    subjectClass?: string,
    /** The request's idempotency key: a sharded check's sub-bucket is then drawn from it (see #route). */
    idempotencyKey?: string,
  ): PreparedCheck {
    const check = this.#route(policy, subject, cost, idempotencyKey);
    if (subjectClass !== undefined) check.subjectClass = subjectClass;
    return check;
  }

  #route(policy: Policy, subject: string, cost: number, idempotencyKey?: string): PreparedCheck {
    if (policy.mode === 'strict' && policy.homeRegion !== this.#config.region) {
      const homeRegion = policy.homeRegion ?? '';
      return this.#config.canForward
        ? { policy, subject, cost, route: 'forward', bucket: undefined, homeRegion, cause: undefined }
        : {
            policy,
            subject,
            cost,
            route: 'fail',
            bucket: undefined,
            homeRegion: undefined,
            cause: 'home_unreachable',
          };
    }
    // local and strict-at-home enforce the whole budget here; regional enforces this region's share.
    const share = policy.mode === 'regional' ? this.#shares.shareFor(policy.name, subject) : FULL_SHARE;
    if (share === undefined) {
      return {
        policy,
        subject,
        cost,
        route: 'fail',
        bucket: undefined,
        homeRegion: undefined,
        cause: 'no_lease',
      };
    }
    // Sized by the kind's own sizing (core/kinds/<kind>/index.ts), typed by the store group that decides it; the
    // group gives the key and the route.
    const kind = kindOf(policy.kind);
    if (kind.decidedBy === 'day') {
      const day = kind.sizing(
        policy,
        dailyKey(policy.version, subject, policy.name),
        cost,
        share,
        this.#config.now(),
      );
      return {
        policy,
        subject,
        cost,
        route: 'day',
        bucket: undefined,
        day,
        homeRegion: undefined,
        cause: undefined,
      };
    }
    if (kind.decidedBy === 'log') {
      const log = kind.sizing(policy, slidingLogKey(policy.version, subject, policy.name), cost, share);
      return {
        policy,
        subject,
        cost,
        route: 'log',
        bucket: undefined,
        log,
        homeRegion: undefined,
        cause: undefined,
      };
    }
    const sizing = kind.sizing;
    const shards = policy.shards;
    if (shards !== undefined) {
      // One sub-bucket of the K, at random: each holds C/K and refills at R/K, so the K never admit more than C.
      // Under an idempotency key the draw comes from the key: the record lives in the sub-bucket's slot (one
      // script decides both on a cluster), so a retry must land on the same sub-bucket to find it.
      const draw =
        idempotencyKey === undefined ? this.#config.random() : keyDraw(idempotencyKey, subject, policy.name);
      const k = Math.min(shards - 1, Math.floor(draw * shards));
      const part = {
        ...policy,
        capacity: policy.capacity / shards,
        refillPerSecond: policy.refillPerSecond / shards,
      };
      return {
        policy,
        subject,
        cost,
        route: 'store',
        bucket: sizing(part, shardKey(policy.version, subject, policy.name, k), cost, share),
        homeRegion: undefined,
        cause: undefined,
      };
    }
    const bucket = sizing(policy, bucketKey(policy.version, subject, policy.name), cost, share);
    // A subject-creation cap: only a creation taken from the cap may make this bucket (store-group.ts).
    if (policy.newSubjects !== undefined && subject !== ANONYMOUS_SUBJECT) bucket.mustExist = true;
    return {
      policy,
      subject,
      cost,
      route: 'store',
      bucket,
      homeRegion: undefined,
      cause: undefined,
    };
  }
}

/** [0, 1) from an idempotency key, a subject and a policy: the same retry draws the same sub-bucket. */
function keyDraw(idempotencyKey: string, subject: string, policy: string): number {
  return (
    createHash('sha1').update(`${idempotencyKey}\n${subject}\n${policy}`).digest().readUInt32BE(0) / 2 ** 32
  );
}

/** Layered checks: each (policy, subject) at most once, and forwarded checks to one home region at most. */
function assertOneRequest(checks: readonly PreparedCheck[]): void {
  const seen = new Set<string>();
  const homes = new Set<string>();
  for (const p of checks) {
    const id = `${p.policy.name}\u0000${p.subject}`;
    if (seen.has(id)) throw new AgentErrors.AGT_ERR_DUPLICATE_CHECK(p.policy.name);
    seen.add(id);
    if (p.route === 'forward') homes.add(p.homeRegion);
  }
  if (homes.size > 1) throw new AgentErrors.AGT_ERR_MIXED_HOME_REGIONS([...homes].join(', '));
}

/**
 * The class a check's subject has under `policy`: the one the check names, else the one the policy's `subjects`
 * names for it, else none. Throws AGT_ERR_UNKNOWN_CLASS for a class the policy does not define.
 */
function classOf(policy: Policy, rawSubject: string, requested: string | undefined): string | undefined {
  if (requested !== undefined) {
    if (!hasOwnKey(policy.classes, requested)) {
      throw new AgentErrors.AGT_ERR_UNKNOWN_CLASS(requested, policy.name);
    }
    return requested;
  }
  return ownValue(policy.subjects, rawSubject);
}
