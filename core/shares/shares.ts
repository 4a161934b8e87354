/**
 * What a regional agent needs to know to size a bucket: the share of a policy's global budget its region
 * enforces right now. The coordinator's leases feed it (coordinator protocol); until then a static table does.
 */

/** The share of one policy this region enforces for one subject, at this instant. */
export interface RegionalShare {
  /** Fraction of the policy's capacity and refill this region enforces, in [0, 1]. */
  share: number;
  /** Lease epoch the share belongs to (0 for static shares). */
  epoch: number;
  /**
   * The lowest share in force since `sinceMs` (epoch ms, already moved back by the clock-skew margin), when it
   * is lower than `share`: buckets last written before then refill at most at this share (core/models/token-bucket.ts
   * floor), so a share that dipped and rose again mints nothing for idle buckets. Absent when no dip matters.
   */
  floor?: { sinceMs: number; share: number } | undefined;
  /**
   * The lowest share in force within the policy's idle TTL (plus the clock-skew margin), when it is lower than
   * `share`, rises included. A sliding log enforces this one: entries admitted under a smaller share are still in
   * its window, so a share that rose may only be used once they have left it (core/models/sliding-log.ts). A token
   * bucket that does not exist yet starts at it (core/shares/share-sizing.ts).
   */
  lowest?: number | undefined;
}

/** The shares in force at one agent. */
export interface ShareView {
  /**
   * The share of `policy` for `subject` (an override when the subject has one, else the policy's), or
   * `undefined` when this agent holds none (no lease yet, or the policy is unknown to the coordinator).
   */
  shareFor(policy: string, subject: string): RegionalShare | undefined;
  /**
   * Note that a decision under the current epoch of `policy` started; call the returned function when it has
   * finished (answered or failed). An agent acknowledges a new epoch only after every decision it started under
   * an older one has finished.
   */
  enter(policy: string): () => void;
  /**
   * Optional: the shares issued to every region for `subject` of `policy` (its override, else the policy's
   * vector), for a borrower to order its lenders by. Only an estimate: each lender sizes its own bucket from its
   * own share. Undefined when unknown.
   */
  regionShares?(policy: string, subject: string): Readonly<Record<string, number>> | undefined;
  /**
   * Optional: the most each region may be deciding with for `subject` of `policy` (the largest of its issued,
   * pending and safe share: a region settled after its lease lapsed decides with its safe share), for a borrower
   * to bound what a lender could have given. Undefined when unknown.
   */
  regionCeilings?(policy: string, subject: string): Readonly<Record<string, number>> | undefined;
  /**
   * Optional: the share of `policy`'s default unit (its vector without any subject's override): what a subject
   * with no override is sized by. Undefined as `shareFor` is. A view without it gives no direct-decision terms.
   */
  defaultShare?(policy: string): RegionalShare | undefined;
  /**
   * Optional: how long, ms, the default unit's share of `policy` in force now is sure not to shrink by the passage
   * of time alone (a new record is no such shrink: decisions in flight hold its acknowledgement, `enter`).
   * Infinity when nothing but a record can shrink it; 0 when it may shrink at any moment. A view without it gives
   * no direct-decision terms.
   */
  stableForMs?(policy: string): number;
  /**
   * Optional: the subjects of `policy` with a share of their own (an override), which are sized apart from the
   * default unit. A view without it gives no direct-decision terms.
   */
  overrideSubjects?(policy: string): readonly string[];
}

const noop = (): void => undefined;

/** Fixed shares per policy (default `fallback`): single-region deployments, tests, and agents without a coordinator. */
export class StaticShareView implements ShareView {
  readonly #shares: ReadonlyMap<string, number>;
  readonly #fallback: number | undefined;

  constructor(shares: Record<string, number> = {}, fallback: number | undefined = 1) {
    for (const [policy, share] of Object.entries(shares)) {
      if (!(share >= 0 && share <= 1))
        throw new RangeError(`share of ${policy} must be in [0, 1], got ${share}`);
    }
    this.#shares = new Map(Object.entries(shares));
    this.#fallback = fallback;
  }

  shareFor(policy: string): RegionalShare | undefined {
    const share = this.#shares.get(policy) ?? this.#fallback;
    return share === undefined ? undefined : { share, epoch: 0 };
  }

  enter(): () => void {
    return noop;
  }

  defaultShare(policy: string): RegionalShare | undefined {
    return this.shareFor(policy);
  }

  /** Static shares never change while the process runs. */
  stableForMs(): number {
    return Infinity;
  }

  overrideSubjects(): readonly string[] {
    return [];
  }
}
