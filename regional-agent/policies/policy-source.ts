import type { Policy } from '../../core/policy/policy.js';

/**
 * Where an agent learns its policies: a file today, the coordinator's JetStream KV bucket later. Agents depend
 * on this contract only, so the source can be swapped without touching the decision path.
 */
export interface PolicySource {
  /** The policies known now, by name. Empty until `ready()` resolves. */
  current(): ReadonlyMap<string, Policy>;
  /** Resolves once the first complete set of policies is known; rejects if it cannot be loaded. */
  ready(): Promise<void>;
  /** Called with the whole new set after every change. Returns a function that unsubscribes. */
  onChange(listener: (policies: ReadonlyMap<string, Policy>) => void): () => void;
  /** Stop watching and release resources. */
  close(): Promise<void>;
}
