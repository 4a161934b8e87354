/**
 * The agent's warm-up, run before it says ready: dry-run decisions of its own policies through the batch route
 * and the single route, in process (`inject`), so the first real burst does not pay for the first pass through
 * the decision path. Measured on a cold agent: its first batches of 64 decisions took 100-313 ms where the same
 * batches took 3-50 ms once warm, on the same machine under the same load; a client's exchange of a cold agent
 * then came close to its 300 ms timeout. A dry run charges nothing, writes nothing in Redis, borrows nothing and
 * is not counted as a decision; strict policies homed in another region are left out (a dry run of one would be
 * forwarded there).
 */
import type { FastifyInstance } from 'fastify';
import type { Policy } from '../../core/policy/policy.js';

export interface WarmUpOptions {
  /** This agent's region: strict policies homed elsewhere are left out. */
  readonly region: string;
  /** Batches of `batch` dry decisions sent one after another; 0: no warm-up. */
  readonly rounds: number;
  /** Decisions per batch (the client's default batch). Default 64. */
  readonly batch?: number;
}

export interface WarmUpReport {
  /** Batches sent. */
  readonly rounds: number;
  /** Dry decisions answered 200 (decided), of all sent. */
  readonly decided: number;
  readonly sent: number;
  /** How long the warm-up took, ms. */
  readonly ms: number;
}

/** A subject the policy accepts that no caller uses: an address of TEST-NET-1 for `ip` policies. */
function subjectFor(policy: Policy, i: number): string {
  return policy.subjectKind === 'ip' ? `192.0.2.${(i % 254) + 1}` : `qp-warm-up-${i}`;
}

/**
 * An injected request gives its admission slot back when its response closes, on the next tick after it ends;
 * the next warm-up request waits for that, so the warm-up holds one slot at most and an agent allowed a single
 * decision in flight (`QP_MAX_IN_FLIGHT=1`) does not shed its own warm-up (and report the sheds as load).
 */
const slotGivenBack = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** Send the dry decisions; never throws (a warm-up that fails leaves a colder agent, not a broken one). */
export async function warmUp(
  app: FastifyInstance,
  policies: ReadonlyMap<string, Policy>,
  options: WarmUpOptions,
): Promise<WarmUpReport> {
  const started = performance.now();
  const local = [...policies.values()].filter((p) => p.mode !== 'strict' || p.homeRegion === options.region);
  const size = options.batch ?? 64;
  let sent = 0;
  let decided = 0;
  let rounds = 0;
  if (local.length === 0) return { rounds, decided, sent, ms: Math.round(performance.now() - started) };
  for (let round = 0; round < options.rounds; round++) {
    const decisions = Array.from({ length: size }, (_, i) => {
      const policy = local[(round * size + i) % local.length]!;
      return { policy: policy.name, subject: subjectFor(policy, i), dryRun: true };
    });
    try {
      const reply = await app.inject({
        method: 'POST',
        url: '/v1/decisions/batch',
        headers: { 'content-type': 'application/json', 'x-request-id': `warm-up-${round}` },
        payload: JSON.stringify({ decisions }),
      });
      sent += size;
      rounds++;
      if (reply.statusCode === 200) {
        const { answers } = reply.json<{ answers: { status: number }[] }>();
        decided += answers.filter((a) => a.status === 200).length;
      }
      await slotGivenBack();
      // The route a lone decision takes, too.
      const single = await app.inject({
        method: 'POST',
        url: '/v1/decisions',
        headers: { 'content-type': 'application/json', 'x-request-id': `warm-up-${round}-single` },
        payload: JSON.stringify(decisions[0]),
      });
      sent++;
      if (single.statusCode === 200) decided++;
      await slotGivenBack();
    } catch {
      break;
    }
  }
  return { rounds, decided, sent, ms: Math.round(performance.now() - started) };
}
