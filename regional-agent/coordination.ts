/**
 * The agent's link to the coordinator, when `QP_NATS_URL` is set: policies from the coordinator's KV bucket,
 * shares from its leases (LeaseHolder), usage reports, and strict mode both ways (forwarding checks homed
 * elsewhere, answering those homed here). Without it the agent runs standalone on a policies file and static
 * shares.
 */
import { ownValue } from '../core/own-keys.js';
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import type { Logger } from 'pino';
import { systemClock } from '../core/clock.js';
import { farthestRoundTrip } from '../core/distance.js';
import { defaultRenewalBounds } from '../core/lease/trust-checks.js';
import type { PolicySource } from './policies/policy-source.js';
import type { ShareView } from '../core/shares/shares.js';
import type { AgentConfig } from './config.js';
import type { DecisionService } from './decisions/decision-service.js';
import type { Admission } from './resilience/admission.js';
import type { Forwarder } from './decisions/forwarder.js';
import { LeaseHolder } from './leases/lease-holder.js';
import { predecessorTermsOver, type TermsUntilStore } from './terms/terms-until.js';
import type { AgentMetrics } from './observability/metrics.js';
import { natsCredentials, natsCredentialTag } from './nats/credentials.js';
import { KvPolicySource } from './policies/kv-policy-source.js';
import { UsageRecorder } from './reporting/usage-recorder.js';
import { NatsForwarder } from './strict/nats-forwarder.js';
import { StrictResponder } from './strict/strict-responder.js';
import { LoanResponder } from './borrowing/loan-responder.js';
import type { BorrowMetrics } from './borrowing/borrow-metrics.js';
import type { TransferStore } from './borrowing/transfer-store.js';

export interface Coordination {
  nc: NatsConnection;
  policies: PolicySource;
  shares: ShareView;
  usage: UsageRecorder;
  forwarder: Forwarder;
  holder: LeaseHolder;
  /**
   * The restart hold (regional-agent/terms/term-holds.ts): `leave`, a decision entered in the lease before any
   * record was applied, so no revision is acknowledged until it is left; the app leaves it once `over` resolves,
   * when this instance's predecessor's recorded terms have run out (regional-agent/terms/terms-until.ts), which is
   * also when the first heartbeat is sent.
   */
  restartHold: { leave: () => void; over: Promise<void> };
  /** Reasons not to be ready yet (no lease). */
  notReady(): string[];
  /** Start answering strict checks homed in this region, decided by `service`. */
  /** Answer forwarded strict decisions, within each one's deadline. */
  serveStrict(service: DecisionService, admission: Admission): void;
  /** Lend this region's tokens to borrowing regions (the loan queue group of this region). */
  serveLoans(store: TransferStore, admission: Admission, metrics: BorrowMetrics | undefined): void;
  /** Leave the strict and loan queue groups, say goodbye, drain NATS. */
  close(): Promise<void>;
}

/** This agent's stable name: `QP_INSTANCE`, or `host:port`. A restart under the same name replaces it. */
export function agentInstance(config: Pick<AgentConfig, 'instance' | 'port'>): string {
  return config.instance ?? `${hostname()}:${config.port}`;
}

export async function connectCoordination(
  config: Pick<
    AgentConfig,
    | 'natsUrl'
    | 'natsNkeyFile'
    | 'natsTlsCaFile'
    | 'kvNamespace'
    | 'policiesAcceptEmpty'
    | 'instance'
    | 'region'
    | 'port'
    | 'maxLeaseMs'
    | 'maxGraceMs'
    | 'maxReportIntervalMs'
  > &
    Partial<Pick<AgentConfig, 'roundTrips'>>,
  log: Logger,
  metrics: AgentMetrics,
  /** This instance's record of its terms in the region's Redis (regional-agent/redis/terms-until-store.ts). */
  termsUntil: Pick<TermsUntilStore, 'read'>,
): Promise<Coordination> {
  const nc = await connect({
    servers: [...(config.natsUrl ?? [])],
    name: `quotaplane-agent-${config.region}`,
    ...natsCredentials(config.natsNkeyFile, config.natsTlsCaFile),
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
  });
  const namespace = config.kvNamespace;
  const registry = metrics.registry;
  const policies = new KvPolicySource(nc, {
    namespace,
    registry,
    log,
    acceptEmptyReload: config.policiesAcceptEmpty ?? false,
  });
  // The records say which subjects to report every interval (override candidates): the lease knows them.
  const usage = new UsageRecorder(systemClock.now(), {
    watched: (policy) => holder.lease.watched(policy),
    // A subject's refusals count as demand only within its own global rate (core/shares/usage-accounting.ts).
    limitPerSecond: (policy) => policies.current().get(policy)?.refillPerSecond,
  });
  // Not known to the coordinator until a predecessor's terms have run out: its first heartbeat under the same
  // instance would make the coordinator forget the predecessor and settle the region's pending shrinks, which
  // those terms may still be deciding under. Whether or not terms are on now: the predecessor may have had them.
  // How long is what the predecessor recorded in Redis before it answered each term (no wait when nothing is).
  const over = predecessorTermsOver({ store: termsUntil, log });
  const holder: LeaseHolder = new LeaseHolder({
    nc,
    region: config.region,
    instance: agentInstance(config),
    firstHeartbeatAfter: over,
    clock: systemClock,
    namespace,
    credentialTag: natsCredentialTag(config.natsNkeyFile),
    usage,
    farthestRoundTripMs:
      config.roundTrips === undefined ? 0 : farthestRoundTrip(config.roundTrips, config.region),
    renewalBounds: {
      maxLeaseMs: config.maxLeaseMs,
      maxGraceMs: config.maxGraceMs,
      minReportIntervalMs: defaultRenewalBounds.minReportIntervalMs,
      maxReportIntervalMs: config.maxReportIntervalMs,
    },
    registry,
    log,
  });
  // Entered before the first record is applied (revision 0): terms a predecessor of this process gave may
  // still be in use, so nothing is acknowledged until they have run out (the app leaves it then).
  const restartHold = { leave: holder.lease.enter(''), over };
  // The first load waits for the coordinator's bucket; the agent listens meanwhile, not ready.
  holder.start().catch((error: unknown) => log.error({ err: error }, 'lease holder failed to start'));
  const forwarder = new NatsForwarder({
    nc,
    region: config.region,
    namespace,
    registry,
    roundTrips: config.roundTrips,
  });
  let responder: StrictResponder | undefined;
  let lender: LoanResponder | undefined;
  // A region is known when an allocation record names it (the coordinator's configured regions): strict and
  // loan requests from any other name are refused or counted as `other`, never as a label of their own.
  const knownRegion = (region: string): boolean =>
    holder.lease
      .policies()
      .some((policy) => ownValue(holder.lease.regionShares(policy, '') ?? {}, region) !== undefined);
  return {
    nc,
    policies,
    shares: holder.lease,
    usage,
    forwarder,
    holder,
    restartHold,
    notReady: () => holder.notReady(),
    serveStrict: (service, admission) => {
      responder = new StrictResponder({
        nc,
        region: config.region,
        namespace,
        registry,
        log,
        decide: (request) => service.decideForwarded(request, randomUUID()),
        admit: () => admission.enter('strict'),
        knownRegion,
      });
      responder.start();
    },
    serveLoans: (store, admission, borrowMetrics) => {
      lender = new LoanResponder({
        nc,
        region: config.region,
        namespace,
        policies,
        shares: holder.lease,
        store,
        admit: () => admission.enter('loan'),
        metrics: borrowMetrics,
        knownRegion,
        log,
      });
      lender.start();
    },
    close: async () => {
      await lender?.stop();
      await responder?.stop();
      await holder.stop();
      await nc.drain().catch(() => nc.close());
    },
  };
}
