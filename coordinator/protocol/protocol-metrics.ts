/** The protocol engine's Prometheus metrics, on the coordinator's registry. */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

export interface ProtocolMetrics {
  messages: Counter<'kind'>;
  dropped: Counter<'kind' | 'reason'>;
  subjectsDropped: Counter<'reason'>;
  writes: Counter<'outcome'>;
  writeSeconds: Histogram;
  rounds: Counter;
  roundSeconds: Histogram;
  shares: Gauge<'policy' | 'region'>;
  learning: Gauge;
  engine: Gauge<'counter'>;
  reportLag: Gauge<'region'>;
  agents: Gauge<'region' | 'state'>;
  moveAuditFailures: Counter;
  snapshots: Counter<'outcome'>;
}

/** The metrics of the KV writes (allocation records and share moves), a part of ProtocolMetrics. */
export type WriteMetrics = Pick<ProtocolMetrics, 'writes' | 'writeSeconds' | 'moveAuditFailures'>;

/** One set per registry: an engine started again on the same registry (a start retried) shares it. */
const made = new WeakMap<Registry, ProtocolMetrics>();

export function protocolMetrics(registry: Registry): ProtocolMetrics {
  const existing = made.get(registry);
  if (existing !== undefined) return existing;
  const metrics = newProtocolMetrics(registry);
  made.set(registry, metrics);
  return metrics;
}

function newProtocolMetrics(registry: Registry): ProtocolMetrics {
  const registers = [registry];
  return {
    messages: new Counter({
      name: 'quotaplane_protocol_messages_total',
      help: 'Protocol messages received from agents, by kind.',
      labelNames: ['kind'],
      registers,
    }),
    dropped: new Counter({
      name: 'quotaplane_protocol_messages_dropped_total',
      help: 'Protocol messages dropped (invalid, region mismatch), by kind and reason.',
      labelNames: ['kind', 'reason'],
      registers,
    }),
    subjectsDropped: new Counter({
      name: 'quotaplane_protocol_subjects_dropped_total',
      help: 'Subjects of usage reports left out of override tracking (not_a_record_key: "__proto__"), by reason.',
      labelNames: ['reason'],
      registers,
    }),
    writes: new Counter({
      name: 'quotaplane_allocation_writes_total',
      help: 'Allocation record writes to JetStream KV, by outcome (invalid: refused, agents could not read it).',
      labelNames: ['outcome'],
      registers,
    }),
    writeSeconds: new Histogram({
      name: 'quotaplane_allocation_write_seconds',
      help: 'Latency of allocation record writes.',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers,
    }),
    rounds: new Counter({
      name: 'quotaplane_rebalance_rounds_total',
      help: 'Rebalance rounds run.',
      registers,
    }),
    roundSeconds: new Histogram({
      name: 'quotaplane_rebalance_round_seconds',
      help: 'CPU-bound duration of one rebalance round.',
      buckets: [0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
      registers,
    }),
    shares: new Gauge({
      name: 'quotaplane_shares_issued',
      help: 'Share of each policy issued to each region (default vector).',
      labelNames: ['policy', 'region'],
      registers,
    }),
    learning: new Gauge({
      name: 'quotaplane_coordinator_learning',
      help: '1 while the coordinator is in learning mode after a start (it grows no share).',
      registers,
    }),
    reportLag: new Gauge({
      name: 'quotaplane_region_report_lag_seconds',
      help: 'Age of the last heartbeat or usage report from each region.',
      labelNames: ['region'],
      registers,
    }),
    agents: new Gauge({
      name: 'quotaplane_region_agents',
      help: 'Agents the coordinator knows per region: live, or lapsed (counted at their safe share).',
      labelNames: ['region', 'state'],
      registers,
    }),
    moveAuditFailures: new Counter({
      name: 'quotaplane_move_audit_failures_total',
      help: 'Share moves that could not be appended to the audit trail (logged at warn level).',
      registers,
    }),
    snapshots: new Counter({
      name: 'quotaplane_demand_snapshots_total',
      help: 'Demand snapshots by outcome: written, write_failed, unavailable (no bucket); read at start: restored, stale, future, unknown_policy, no_regions, newer_epoch, invalid.',
      labelNames: ['outcome'],
      registers,
    }),
    engine: new Gauge({
      name: 'quotaplane_protocol_engine_counter',
      help: 'Cumulative protocol engine counters (shrinks, grows, safety shrinks, overrides, refusals…).',
      labelNames: ['counter'],
      registers,
    }),
  };
}
