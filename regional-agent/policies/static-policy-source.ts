import type { Policy } from '../../core/policy/policy.js';
import type { PolicySource } from './policy-source.js';

/** A fixed set of policies: tests, benchmarks and embedding. */
export class StaticPolicySource implements PolicySource {
  readonly #policies: ReadonlyMap<string, Policy>;
  constructor(policies: readonly Policy[]) {
    this.#policies = new Map(policies.map((p) => [p.name, p]));
  }
  current(): ReadonlyMap<string, Policy> {
    return this.#policies;
  }
  ready(): Promise<void> {
    return Promise.resolve();
  }
  onChange(): () => void {
    return () => undefined;
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}
