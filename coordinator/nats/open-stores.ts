/**
 * Open the coordinator's JetStream state on a NATS connection: the policies bucket, the audit stream, and a
 * readiness probe that follows the connection.
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import type { Clock } from '../../core/clock.js';
import { kvNames, type KvNames } from '../../core/wire/kv.js';
import { ensureAuditStream, JetStreamAuditTrail } from '../audit/jetstream-audit-trail.js';
import type { CoordinatorConfig } from '../config.js';
import type { CoordinatorMetrics } from '../metrics.js';
import { KvPolicyStore } from '../policies/kv-policy-store.js';
import { KvGuard } from './kv-guard.js';
import { ensureReplicas } from './replicas.js';
import type { Logger, ReadinessProbe } from '../ports.js';
import { stepper, type StartSteps } from '../start-steps.js';

/** Settings of the policies bucket. Fixed: agents bind to it as it is. */
export const POLICY_BUCKET_OPTIONS = {
  history: 10,
  maxValueSize: 16 * 1024,
  description: 'quotaplane policies (key: policy name with . as =)',
} as const;

export interface CoordinatorStores {
  readonly names: KvNames;
  readonly kv: KV;
  readonly policies: KvPolicyStore;
  readonly audit: JetStreamAuditTrail;
  /** Restores policies someone else wrote; closed with `readiness`. */
  readonly guard: KvGuard;
  readonly readiness: ReadinessProbe & { close(): void };
}

export async function openStores(
  nc: NatsConnection,
  config: Pick<
    CoordinatorConfig,
    'kvNamespace' | 'natsTimeoutMs' | 'regions' | 'maxPolicies' | 'audit' | 'replicas'
  >,
  deps: { clock: Clock; metrics: CoordinatorMetrics; log: Logger; steps?: StartSteps | undefined },
): Promise<CoordinatorStores> {
  const step = stepper(deps.steps);
  const names = kvNames(config.kvNamespace);
  // JetStream is checked once, here (an account info request, which the meta leader answers); the bucket is then
  // opened without checking again (`checkAPI: false`): a request to the meta leader fewer.
  const jsm = await step('jetstream', () => jetstreamManager(nc, { timeout: config.natsTimeoutMs }));
  const js = jetstream(nc, { timeout: config.natsTimeoutMs });
  const opener = new Kvm(jetstream(nc, { timeout: config.natsTimeoutMs, checkAPI: false }));
  const replicas = config.replicas ?? 1;
  // The policies bucket and the audit stream are independent: opened side by side.
  const [kv] = await Promise.all([
    (async () => {
      const kv = await step('policies_bucket', () =>
        opener.create(names.policies, { ...POLICY_BUCKET_OPTIONS, replicas }),
      );
      await step('policies_replicas', () => ensureReplicas(jsm, `KV_${names.policies}`, replicas));
      return kv;
    })(),
    step('audit_stream', () => ensureAuditStream(jsm, names, config.audit, replicas)),
  ]);
  const audit = new JetStreamAuditTrail({ js, jsm, names, metrics: deps.metrics, log: deps.log });
  const guard: KvGuard = new KvGuard({
    nc,
    bucket: names.policies,
    timeoutMs: config.natsTimeoutMs,
    registry: deps.metrics.registry,
    log: deps.log,
    clock: deps.clock,
    audit,
    restore: (key, payload) => policies.restore(key, payload),
  });
  const policies: KvPolicyStore = new KvPolicyStore({
    kv,
    js,
    bucket: names.policies,
    audit,
    regions: config.regions,
    maxPolicies: config.maxPolicies,
    clock: deps.clock,
    metrics: deps.metrics,
    log: deps.log,
    guard,
  });
  await step('policies_load', () => policies.init());
  guard.start();
  const readiness = natsReadiness(nc);
  return {
    names,
    kv,
    policies,
    audit,
    guard,
    readiness: {
      reasons: () => readiness.reasons(),
      close: () => {
        readiness.close();
        void guard.close();
      },
    },
  };
}

/** Ready while the connection is up; follows the client's status events. */
export function natsReadiness(nc: NatsConnection): ReadinessProbe & { close(): void } {
  let connected = !nc.isClosed();
  // A QueuedIterator (stop() ends it), typed as a plain AsyncIterable.
  const status = nc.status() as AsyncIterable<{ type: string }> & { stop?: () => void };
  void (async () => {
    for await (const s of status) {
      if (s.type === 'disconnect' || s.type === 'reconnecting') connected = false;
      else if (s.type === 'reconnect') connected = true;
    }
  })();
  return {
    reasons: () => {
      if (nc.isClosed()) return ['nats connection closed'];
      if (nc.isDraining()) return ['nats connection draining'];
      return connected ? [] : ['nats disconnected'];
    },
    close: () => status.stop?.(),
  };
}
