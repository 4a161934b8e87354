/**
 * The agent's link to the coordinator, when `QP_NATS_URL` is set: policies from the coordinator's KV bucket,
 * shares from its leases (LeaseHolder), usage reports, and strict mode both ways (forwarding checks homed
 * elsewhere, answering those homed here). Without it the agent runs standalone on a policies file and static
 * shares.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import type { Logger } from 'pino';
import { systemClock } from '../core/clock.js';
import type { PolicySource } from '../core/policy-source.js';
import type { ShareView } from '../core/shares.js';
import type { AgentConfig } from './config.js';
import type { DecisionService } from './decisions/decision-service.js';
import type { Forwarder } from './decisions/forwarder.js';
import { LeaseHolder } from './leases/lease-holder.js';
import type { AgentMetrics } from './observability/metrics.js';
import { KvPolicySource } from './policies/kv-policy-source.js';
import { UsageRecorder } from './reporting/usage-recorder.js';
import { NatsForwarder } from './strict/nats-forwarder.js';
import { StrictResponder } from './strict/strict-responder.js';

export interface Coordination {
  nc: NatsConnection;
  policies: PolicySource;
  shares: ShareView;
  usage: UsageRecorder;
  forwarder: Forwarder;
  holder: LeaseHolder;
  /** Reasons not to be ready yet (no lease). */
  notReady(): string[];
  /** Start answering strict checks homed in this region, decided by `service`. */
  serveStrict(service: DecisionService): void;
  /** Leave the strict queue group, say goodbye, drain NATS. */
  close(): Promise<void>;
}

export async function connectCoordination(
  config: Pick<AgentConfig, 'natsUrl' | 'kvNamespace' | 'instance' | 'region' | 'port'>,
  log: Logger,
  metrics: AgentMetrics,
): Promise<Coordination> {
  const nc = await connect({
    servers: [...(config.natsUrl ?? [])],
    name: `quotaplane-agent-${config.region}`,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
  });
  const namespace = config.kvNamespace;
  const registry = metrics.registry;
  const policies = new KvPolicySource(nc, { namespace, registry, log });
  // The records say which subjects to report every interval (override candidates): the lease knows them.
  const usage = new UsageRecorder(systemClock.now(), { watched: (policy) => holder.lease.watched(policy) });
  const holder: LeaseHolder = new LeaseHolder({
    nc,
    region: config.region,
    instance: config.instance ?? `${hostname()}:${config.port}`,
    clock: systemClock,
    namespace,
    usage,
    registry,
    log,
  });
  // The first load waits for the coordinator's bucket; the agent listens meanwhile, not ready.
  holder.start().catch((error: unknown) => log.error({ err: error }, 'lease holder failed to start'));
  const forwarder = new NatsForwarder({ nc, region: config.region, namespace, registry });
  let responder: StrictResponder | undefined;
  return {
    nc,
    policies,
    shares: holder.lease,
    usage,
    forwarder,
    holder,
    notReady: () => (holder.ready() ? [] : ['no lease from the coordinator yet']),
    serveStrict: (service) => {
      responder = new StrictResponder({
        nc,
        region: config.region,
        namespace,
        registry,
        log,
        decide: (request) => service.decideForwarded(request, randomUUID()),
      });
      responder.start();
    },
    close: async () => {
      await responder?.stop();
      await holder.stop();
      await nc.drain().catch(() => nc.close());
    },
  };
}
