/**
 * The replay's calls to the stack other than decisions: the admin API (create and delete the replayed policy,
 * read its issued shares), each service's /metrics, and dry-run decisions to see every agent ready for a policy.
 * Answers are parsed with the wire schemas of core/.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { AllocationsResponse } from '../../core/wire/admin.js';
import { DecisionResponse } from '../../core/wire/agent.js';
import type { PolicySpecInput } from '../../core/policy/policy.js';
import { ownValue } from '../../core/own-keys.js';
import { parsePrometheusText, type MetricSample } from './prometheus-text.js';
import { ReplayError, ReplayInterrupted } from './replay-errors.js';
import type { StackEndpoints } from './stack-session.js';

const TIMEOUT_MS = 5000;

export class StackClient {
  readonly #e: StackEndpoints;

  constructor(endpoints: StackEndpoints) {
    this.#e = endpoints;
  }

  /** Create `name` (create-only: a name in use is an error, never overwritten). */
  async createPolicy(name: string, body: PolicySpecInput): Promise<void> {
    const r = await this.#fetch(`${this.#e.coordinator}/v1/policies/${name}`, {
      method: 'PUT',
      headers: {
        authorization: `Bearer ${this.#e.adminToken}`,
        'content-type': 'application/json',
        'if-none-match': '*',
      },
      body: JSON.stringify(body),
    });
    if (r.status === 201) {
      await r.body?.cancel();
      return;
    }
    throw new ReplayError(
      `the coordinator refused policy ${name} (${r.status}): ${await r.text()}\n(body: ${JSON.stringify(body)})`,
    );
  }

  /** Delete `name`; false when the coordinator did not (the replay reports it, nothing else depends on it). */
  async deletePolicy(name: string): Promise<boolean> {
    try {
      const r = await this.#fetch(`${this.#e.coordinator}/v1/policies/${name}`, {
        method: 'DELETE',
        headers: { authorization: `Bearer ${this.#e.adminToken}` },
      });
      await r.body?.cancel();
      return r.status === 204 || r.status === 200;
    } catch {
      return false;
    }
  }

  /** The shares the coordinator issued to each region for `policy` (default vector), undefined if not listed. */
  async issuedShares(policy: string, regions: readonly string[]): Promise<number[] | undefined> {
    const r = await this.#fetch(`${this.#e.coordinator}/v1/allocations`, {
      headers: { authorization: `Bearer ${this.#e.readToken}` },
    });
    if (r.status !== 200) {
      await r.body?.cancel();
      return undefined;
    }
    const parsed = AllocationsResponse.safeParse(await r.json());
    const entry = parsed.success ? parsed.data.policies.find((p) => p.policy === policy) : undefined;
    return entry === undefined ? undefined : regions.map((region) => ownValue(entry.shares, region) ?? 0);
  }

  coordinatorMetrics(): Promise<MetricSample[]> {
    return this.#metrics(this.#e.coordinator);
  }

  agentMetrics(region: number): Promise<MetricSample[]> {
    return this.#metrics(this.#e.agents[region]!);
  }

  /**
   * Wait until every agent answers a dry run of `policy` with an ordinary decision (it knows the policy and holds
   * a lease for it; a strict policy's home answers forwarded ones). Dry runs charge nothing and count as no demand.
   */
  async waitReady(policy: string, timeoutMs: number, signal: AbortSignal): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const pending = new Set(this.#e.agents.keys());
    let last = '';
    while (pending.size > 0) {
      if (signal.aborted) throw new ReplayInterrupted(String(signal.reason ?? 'interrupted'));
      for (const region of [...pending]) {
        const state = await this.#dryRun(region, policy);
        if (state === 'ready') pending.delete(region);
        else last = `agent ${this.#e.agents[region]!}: ${state}`;
      }
      if (pending.size === 0) return;
      if (Date.now() > deadline)
        throw new ReplayError(
          `the agents were not ready for policy ${policy} within ${timeoutMs} ms (${last})`,
        );
      await sleep(50);
    }
  }

  async #dryRun(region: number, policy: string): Promise<string> {
    try {
      const r = await this.#fetch(`${this.#e.agents[region]!}/v1/decisions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ policy, subject: 'replay-probe', dryRun: true }),
      });
      const body: unknown = await r.json();
      if (r.status !== 200) return `status ${r.status} ${JSON.stringify(body)}`;
      const decision = DecisionResponse.safeParse(body);
      if (!decision.success) return 'an answer that is not a decision';
      const reason = decision.data.results[0]?.reason;
      return reason === undefined ? 'ready' : `reason ${reason}`;
    } catch (error) {
      return error instanceof Error ? error.message : String(error);
    }
  }

  async #metrics(base: string): Promise<MetricSample[]> {
    const r = await this.#fetch(`${base}/metrics`, {});
    if (r.status !== 200) throw new ReplayError(`${base}/metrics answered ${r.status}`);
    return parsePrometheusText(await r.text());
  }

  async #fetch(url: string, init: RequestInit): Promise<Response> {
    try {
      return await fetch(url, { ...init, signal: AbortSignal.timeout(TIMEOUT_MS) });
    } catch (error) {
      throw new ReplayError(
        `${init.method ?? 'GET'} ${url} failed: ${error instanceof Error ? error.message : String(error)}`,
        { cause: error },
      );
    }
  }
}
