/**
 * A reported subject no allocation record can hold (`__proto__`: `ownRecord` refuses it as a key, so a record with
 * an override of it fails AllocationRecord on every agent). Where the coordinator reads usage it leaves such a
 * subject out (recordableUsage), so the lease coordinator never tracks, watches or overrides it; and the writer
 * refuses, as a failed write, any record the agents' schema would not read (the last line, whatever the cause).
 */
import type { NatsConnection } from '@nats-io/nats-core';
import type { KV } from '@nats-io/kv';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import {
  AllocationWriter,
  unreadableRecord,
} from '../../../../coordinator/protocol/allocation-persistence.js';
import type { AllocationInsight } from '../../../../coordinator/protocol/allocation-insight.js';
import { protocolMetrics } from '../../../../coordinator/protocol/protocol-metrics.js';
import { recordableUsage } from '../../../../coordinator/protocol/report-subjects.js';
import type { EngineContext } from '../../../../coordinator/ports.js';
import { systemClock } from '../../../../core/clock.js';
import type { LeaseCoordinator, RecordWrite } from '../../../../core/lease/lease-coordinator.js';
import { ownRecordOf } from '../../../../core/own-keys.js';
import { parsePolicy } from '../../../../core/policy/policy.js';
import {
  AllocationRecord,
  isRecordableSubject,
  type UnitRecord,
  type Usage,
} from '../../../../core/wire/protocol.js';
import { ProtocolLoop } from '../../../helpers/protocol-loop.js';

const regions = ['us', 'eu', 'ap'];

describe('subjects no allocation record can hold', () => {
  it('is exactly "__proto__", the one key the record schema refuses', () => {
    for (const subject of [
      '__proto__',
      'tenant-hot',
      'constructor',
      'toString',
      '__PROTO__',
      '__proto__ ',
      'x',
    ]) {
      const unit: UnitRecord = { shares: { us: 1 }, pending: {}, epoch: 0 };
      const record = {
        policy: 'writes',
        version: 1,
        epoch: 0,
        safe: { us: 1 },
        idleTtlSeconds: 60,
        default: unit,
        overrides: ownRecordOf([[subject, unit]]),
        updatedAt: 0,
      };
      const readable = AllocationRecord.safeParse(JSON.parse(JSON.stringify(record))).success;
      expect([subject, isRecordableSubject(subject)]).toEqual([subject, readable]);
    }
  });

  it('recordableUsage leaves them out of constrained and watched, and keeps everything else', () => {
    const subject = (s: string) => ({ subject: s, requested: 5, denied: 3 });
    const usage: Usage = {
      agentId: 'open_agent-ap-0001',
      region: 'ap',
      seq: 1,
      intervalMs: 1000,
      chunk: 0,
      chunks: 1,
      policies: [
        {
          policy: 'writes',
          requested: 20,
          admitted: 17,
          denied: 3,
          constrained: [subject('__proto__'), subject('tenant-hot')],
          watched: [subject('__proto__'), subject('constructor')],
        },
        { policy: 'reads', requested: 1, admitted: 1, denied: 0, constrained: [] },
      ],
      dropped: 0,
    };
    const out = recordableUsage(usage);
    expect(out.dropped).toBe(2);
    expect(out.usage.policies).toEqual([
      { ...usage.policies[0], constrained: [subject('tenant-hot')], watched: [subject('constructor')] },
      usage.policies[1],
    ]);
    // Nothing to leave out: the same message, not a copy.
    const clean = { ...usage, policies: [usage.policies[1]!] };
    expect(recordableUsage(clean)).toEqual({ usage: clean, dropped: 0 });
    expect(recordableUsage(clean).usage).toBe(clean);
  });

  it('fed through recordableUsage, the lease coordinator overrides the ordinary subject and never "__proto__"', () => {
    const loop = new ProtocolLoop({ regions, agentsPerRegion: 2 });
    // Reports reach the engine the way the coordinator's usage handler passes them on (protocol-engine.ts).
    const wrap = () => {
      const engine = loop.engine!;
      const usage = engine.usage.bind(engine);
      engine.usage = (message) => usage(recordableUsage(message).usage);
    };
    wrap();
    loop.upsertPolicy(parsePolicy({ name: 'writes', capacity: 120, refillPerSecond: 2 }));
    for (const [r, d] of Object.entries({ us: 40, eu: 40, ap: 20 })) loop.setDemand(r, 'writes', d);
    loop.advance(75_000);
    for (const subject of ['tenant-hot', '__proto__'])
      loop.setConstrained('ap', 'writes', subject, { requested: 50, denied: 30 });
    const records: unknown[] = [];
    for (let t = 0; t < 40; t++) {
      loop.advance(1000);
      records.push(JSON.parse(JSON.stringify(loop.kv.get('writes')!.record)));
    }
    const last = records.at(-1) as AllocationRecord;
    expect(Object.keys(last.overrides)).toEqual(['tenant-hot']);
    for (const record of records) {
      const parsed = AllocationRecord.safeParse(record);
      expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
      expect((record as AllocationRecord).watch ?? []).not.toContain('__proto__');
    }
    // Every agent adopted the records: the override is in force in ap.
    for (const a of loop.agents.filter((x) => x.region === 'ap'))
      expect(a.lease.shareFor('writes', 'tenant-hot')?.share).toBeGreaterThan(
        a.lease.shareFor('writes', 'someone-else')!.share,
      );
    expect(loop.checker.violations).toEqual([]);
  });

  it('the writer refuses a record agents could not read: not written, retried, logged once', async () => {
    const unit: UnitRecord = { shares: { us: 0.4, eu: 0.4, ap: 0.2 }, pending: {}, epoch: 1 };
    const record = (subject: string): AllocationRecord => ({
      policy: 'writes',
      version: 1,
      epoch: 3,
      safe: { us: 0.3, eu: 0.3, ap: 0.3 },
      idleTtlSeconds: 60,
      default: unit,
      overrides: ownRecordOf([[subject, unit]]),
      updatedAt: 0,
    });
    expect(unreadableRecord(JSON.stringify(record('__proto__')))).toContain('overrides.__proto__');
    expect(unreadableRecord(JSON.stringify(record('tenant-hot')))).toBeUndefined();

    const queue: RecordWrite[] = [];
    const failed: string[] = [];
    const written: string[] = [];
    const puts: string[] = [];
    const errors: unknown[] = [];
    const engine = {
      takeRegistryWrites: () => [],
      takeWrites: () => queue.splice(0),
      allocations: () => [],
      regionViews: () => [],
      writeFailed: (policy: string) => failed.push(policy),
      written: (policy: string) => written.push(policy),
    } as unknown as LeaseCoordinator;
    const noop = () => undefined;
    const log = { error: (...args: unknown[]) => errors.push(args), warn: noop, info: noop, debug: noop };
    const registry = new Registry();
    const context = {
      nc: {} as NatsConnection,
      names: { allocations: 'qp-allocations' },
      config: { natsTimeoutMs: 1000 },
      clock: systemClock,
      log,
      registry,
    } as unknown as EngineContext;
    const allocations = {
      put: (_key: string, payload: string) => {
        puts.push(payload);
        return Promise.resolve(puts.length);
      },
    } as unknown as KV;
    const writer = new AllocationWriter({
      context,
      engine,
      buckets: { allocations, agents: {} as KV },
      insight: {} as AllocationInsight,
      metrics: protocolMetrics(registry),
      writeConcurrency: 4,
    });
    const invalid = async () =>
      (await registry.getSingleMetric('quotaplane_allocation_writes_total')!.get()).values.find(
        (v) => v.labels['outcome'] === 'invalid',
      )?.value ?? 0;

    for (let i = 0; i < 2; i++) {
      queue.push({ policy: 'writes', record: record('__proto__'), seq: i + 1 });
      await writer.flushNow();
    }
    expect(puts).toEqual([]);
    expect(failed).toEqual(['writes', 'writes']); // taken again next flush: the shares in force stay counted
    expect(written).toEqual([]);
    expect(errors).toHaveLength(1);
    expect(await invalid()).toBe(2);
    expect(writer.lastError).toMatch(/writes would not be readable by agents: overrides\.__proto__/);

    queue.push({ policy: 'writes', record: record('tenant-hot'), seq: 3 });
    await writer.flushNow();
    expect(puts).toHaveLength(1);
    expect(AllocationRecord.safeParse(JSON.parse(puts[0]!)).success).toBe(true);
    expect(written).toEqual(['writes']);
    expect(writer.lastError).toBeUndefined();
  });
});
