/**
 * What the agent closes beyond its own parts: the policy source and what the caller opened for it (Redis,
 * NATS), last; and listeners attached after start (the gRPC one), with the HTTP listener.
 */
import type { FastifyPluginAsync } from 'fastify';
import type { PolicySource } from '../policies/policy-source.js';

/** Closes the policy source, then what the caller opened (`AgentDeps.onClose`), after every part that uses them. */
export function ownedResourcesPlugin(options: {
  policies: PolicySource;
  onClose: (() => Promise<void>) | undefined;
}): FastifyPluginAsync {
  return (scope) => {
    scope.addHook('onClose', async () => {
      await options.policies.close();
      await options.onClose?.();
    });
    return Promise.resolve();
  };
}

export interface Listener {
  close(): Promise<void>;
}

/**
 * Listeners attached to the app: they begin closing as the HTTP listener does (preClose) and are waited for
 * before anything they use closes.
 */
export function attachedListenersPlugin(listeners: readonly Listener[]): FastifyPluginAsync {
  let closing: Promise<unknown> = Promise.resolve();
  return (scope) => {
    scope.addHook('preClose', () => {
      closing = Promise.all(listeners.map((l) => l.close()));
      return Promise.resolve();
    });
    scope.addHook('onClose', async () => {
      await closing;
    });
    return Promise.resolve();
  };
}
