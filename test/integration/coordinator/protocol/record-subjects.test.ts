/**
 * A subject no allocation record can hold, on real NATS with the real coordinator: agents (played here, one per
 * region) report a subject named `__proto__` as constrained in one region, beside an ordinary one. The record's
 * `overrides` is an `ownRecord`, which refuses a `__proto__` key, so an override of it would make every later
 * record of the policy unreadable to every agent (each keeps its last good one) and to a restarted coordinator.
 * The coordinator leaves the subject out where it reads reports (counted in
 * `quotaplane_protocol_subjects_dropped_total`): the ordinary subject gets its override, `__proto__` is never
 * watched nor overridden, and every record written parses with AllocationRecord.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { protocolEngine } from '../../../../coordinator/protocol/protocol-engine.js';
import { startCoordinator, type RunningCoordinator } from '../../../../coordinator/server.js';
import { kvNames, policyKey } from '../../../../core/wire/kv.js';
import {
  AllocationRecord,
  OPEN_CREDENTIAL_TAG,
  protocolSubjects,
  RenewalReply,
  type PolicyUsage,
} from '../../../../core/wire/protocol.js';
import { ADMIN_TOKEN, testConfig, uniqueNamespace } from '../../../helpers/coordinator-fixture.js';

const REGIONS = ['us', 'eu', 'ap'];
/** Requested cost per second of the policy, by region (its default shares follow this). */
const DEMAND: Record<string, number> = { us: 40, eu: 40, ap: 20 };
const INTERVAL_MS = 200;
const HOT = ['tenant-hot', '__proto__'];

describe('a reported subject no allocation record can hold (real NATS, real coordinator)', () => {
  let coordinator: RunningCoordinator;
  let nc: NatsConnection;
  let kv: KV;
  let timer: NodeJS.Timeout | undefined;
  /** Every value of the policy's record the bucket held, as agents read them (raw JSON). */
  const seen: unknown[] = [];
  let lastRevision = 0;
  let reporting: Promise<void> = Promise.resolve();
  let stopWatch: () => void = () => undefined;

  const metric = async (name: string, labels: string): Promise<number> => {
    const text = (await coordinator.app.inject({ url: '/metrics' })).body;
    const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
    return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
  };

  beforeAll(async () => {
    const namespace = uniqueNamespace();
    const config = testConfig({ namespace });
    coordinator = await startCoordinator(config, {
      engine: protocolEngine({
        rebalance: { roundMs: 100, demandHalfLifeMs: 300, confirmMs: 0 },
        lease: {
          leaseMs: 1000,
          graceMs: 2500,
          skewMs: 100,
          reportIntervalMs: INTERVAL_MS,
          maxOverridesPerPolicy: 4,
          overrideTtlMs: 10_000,
        },
      }),
    });
    const put = await fetch(`${coordinator.url}/v1/policies/writes`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ capacity: 120, refillPerSecond: 2 }),
    });
    expect(put.status).toBe(201);
    nc = await connect({ servers: [...config.natsServers] });
    kv = await new Kvm(jetstream(nc)).open(kvNames(namespace).allocations);
    const subjects = protocolSubjects(namespace, OPEN_CREDENTIAL_TAG);
    let seq = 0;
    // One agent per region, heartbeating and reporting every interval; ap's subjects are constrained.
    // Every revision of the record, as an agent's watch delivers it.
    const watcher = await kv.watch({ key: policyKey('writes') });
    void (async () => {
      for await (const entry of watcher) {
        if (entry.operation !== 'PUT') continue;
        lastRevision = entry.revision;
        seen.push(entry.json());
      }
    })();
    stopWatch = () => watcher.stop();
    const report = async (): Promise<void> => {
      const watch = (seen.at(-1) as { watch?: string[] } | undefined)?.watch ?? [];
      seq++;
      await Promise.all(
        REGIONS.map(async (region) => {
          const agentId = `${OPEN_CREDENTIAL_TAG}_agent-${region}-0001`;
          const reply = RenewalReply.parse(
            (
              await nc.request(
                subjects.heartbeat(region),
                JSON.stringify({
                  agentId,
                  instance: `agent-${region}`,
                  region,
                  seq,
                  appliedRevision: lastRevision,
                  ackRevision: lastRevision,
                  mode: 'valid',
                  renewedSeq: seq - 1,
                }),
                { timeout: 1000 },
              )
            ).json(),
          );
          expect(reply).not.toHaveProperty('refused');
          const hot = region === 'ap' ? HOT.map((subject) => ({ subject, requested: 6, denied: 4 })) : [];
          const requested = (DEMAND[region]! * INTERVAL_MS) / 1000;
          const usage: PolicyUsage = {
            policy: 'writes',
            requested,
            admitted: requested,
            denied: 0,
            demand: requested,
            constrained: hot,
            // Every watched subject with what it asked here (zero outside ap), as agents report them.
            watched: watch.map(
              (subject) => hot.find((h) => h.subject === subject) ?? { subject, requested: 0, denied: 0 },
            ),
          };
          nc.publish(
            subjects.usage(region),
            JSON.stringify({
              agentId,
              region,
              seq,
              intervalMs: INTERVAL_MS,
              chunk: 0,
              chunks: 1,
              policies: [usage],
              dropped: 0,
            }),
          );
        }),
      );
    };
    timer = setInterval(() => {
      reporting = reporting.then(report).catch(() => undefined);
    }, INTERVAL_MS);
  }, 30_000);

  afterAll(async () => {
    clearInterval(timer);
    await reporting;
    stopWatch();
    await nc?.close();
    await coordinator?.stop();
  });

  it('the ordinary subject gets an override; __proto__ is dropped, never watched, and every record is readable', async () => {
    await expect
      .poll(() => seen.some((r) => Object.hasOwn((r as { overrides: object }).overrides, 'tenant-hot')), {
        timeout: 30_000,
        interval: 200,
      })
      .toBe(true);
    // What an agent would drop (and keep its last good record instead): none.
    const unreadable = seen.filter((r) => !AllocationRecord.safeParse(r).success);
    expect(unreadable.map((r) => AllocationRecord.safeParse(r).error?.issues[0]?.message)).toEqual([]);
    for (const record of seen) {
      const parsed = AllocationRecord.safeParse(record);
      expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
      expect(Object.keys((record as { overrides: object }).overrides)).not.toContain('__proto__');
      expect((record as { watch?: string[] }).watch ?? []).not.toContain('__proto__');
    }
    expect(
      await metric('quotaplane_protocol_subjects_dropped_total', 'reason="not_a_record_key"'),
    ).toBeGreaterThan(0);
    expect(await metric('quotaplane_allocation_writes_total', 'outcome="invalid"')).toBe(0);
  });
});
