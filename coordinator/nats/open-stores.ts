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
import { POLICY_VALUE_MAX_BYTES } from '../policies/validate.js';
import { KvGuard } from './kv-guard.js';
import { openAndRead } from './kv-read.js';
import type { Logger, ReadinessProbe } from '../ports.js';
import { stepper, type StartSteps } from '../start-steps.js';

/** Settings of the policies bucket. Fixed: agents bind to it as it is. */
export const POLICY_BUCKET_OPTIONS = {
  history: 10,
  maxValueSize: POLICY_VALUE_MAX_BYTES,
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
  deps: {
    clock: Clock;
    metrics: CoordinatorMetrics;
    log: Logger;
    steps?: StartSteps | undefined;
    /**
     * Whether JetStream is checked first (an account info request, which JetStream's meta leader answers). Default
     * true; false once the leader lease was taken (opening its bucket checked it): just after a takeover the meta
     * leader may still be elected, and nothing else of the start needs it.
     */
    checkJetStream?: boolean;
  },
): Promise<CoordinatorStores> {
  const step = stepper(deps.steps);
  const names = kvNames(config.kvNamespace);
  // JetStream is checked at most once, here; the buckets are then opened without checking again
  // (`checkAPI: false`): a request to the meta leader fewer each.
  const jsm =
    deps.checkJetStream === false
      ? await jetstreamManager(nc, { timeout: config.natsTimeoutMs, checkAPI: false })
      : await step('jetstream', () => jetstreamManager(nc, { timeout: config.natsTimeoutMs }));
  const js = jetstream(nc, { timeout: config.natsTimeoutMs });
  const opener = new Kvm(jetstream(nc, { timeout: config.natsTimeoutMs, checkAPI: false }));
  const replicas = config.replicas ?? 1;
  // The policies bucket and the audit stream are independent: opened side by side. The policies are read as they
  // are now from the stream's leader (a direct get may be answered by a replica still catching up) and without a
  // consumer, whose creation needs JetStream's meta leader (coordinator/nats/kv-read.ts).
  const [opened] = await Promise.all([
    openAndRead({
      kvm: opener,
      jsm,
      bucket: names.policies,
      settings: { ...POLICY_BUCKET_OPTIONS, replicas },
      what: 'policies',
      step,
    }),
    step('audit_stream', () => ensureAuditStream(jsm, names, config.audit, replicas)),
  ]);
  const kv = opened.kv;
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
  await policies.init(opened.entries);
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
