/**
 * An agent follows the newest coordinator epoch, on real NATS: once it has a renewal of epoch 2, a heartbeat reply
 * of epoch 1 (a coordinator that lost the leader lease and does not know it yet) renews nothing and is counted.
 * The responders here stand in for two coordinators: each answers every other heartbeat.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import { Registry } from 'prom-client';
import { describe, expect, inject, it } from 'vitest';
import { systemClock } from '../../../../core/clock.js';
import { kvNames } from '../../../../core/wire/kv.js';
import { OPEN_CREDENTIAL_TAG, protocolSubjects, type Renewal } from '../../../../core/wire/protocol.js';
import { LeaseHolder } from '../../../../regional-agent/leases/lease-holder.js';
import { uniqueNamespace } from '../../../helpers/coordinator-fixture.js';
import { eventually } from '../../../helpers/wait.js';

const renewal = (leaderEpoch: number): Renewal => ({
  coordinatorId: `coordinator-${leaderEpoch}`,
  leaseMs: 3000,
  graceMs: 8000,
  minRevision: 0,
  learning: false,
  reportIntervalMs: 500,
  leaderEpoch,
});

async function outcomes(registry: Registry): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('quotaplane_agent_heartbeats_total')!.get();
  return Object.fromEntries(metric.values.map((v) => [String(v.labels['outcome']), v.value]));
}

describe('leader epochs at the agent', { timeout: 30_000 }, () => {
  it('ignores heartbeat replies of an older epoch once it has seen a newer one', async () => {
    const namespace = uniqueNamespace();
    const nc = await connect({ servers: inject('nats').url });
    const registry = new Registry();
    const holder = new LeaseHolder({
      nc,
      region: 'us',
      instance: 'us-epochs',
      clock: systemClock,
      namespace,
      reportIntervalMs: 500,
      startupWaitMs: 500,
      registry,
    });
    try {
      await new Kvm(jetstream(nc)).create(kvNames(namespace).allocations, { history: 1 });
      // The new leader answers first; from then on the old one answers every other heartbeat.
      let beats = 0;
      let old = 0;
      const sub = nc.subscribe(protocolSubjects(namespace, OPEN_CREDENTIAL_TAG).heartbeat('us'), {
        callback: (_e, msg) => {
          beats++;
          const epoch = beats === 1 || beats % 2 === 0 ? 2 : 1;
          if (epoch === 1) old++;
          msg.respond(JSON.stringify(renewal(epoch)));
        },
      });
      await holder.start();
      await eventually(
        async () => ((await outcomes(registry))['stale_epoch'] ?? 0) >= 3,
        10_000,
        'three old replies',
      );
      sub.unsubscribe();
      // Every reply of epoch 1 (all after the first of epoch 2) is refused; every one of epoch 2 renews.
      await eventually(
        async () => (await outcomes(registry))['stale_epoch'] === old,
        2000,
        'each old reply counted once it arrived',
      );
      const seen = await outcomes(registry);
      expect(holder.leaderEpoch).toBe(2);
      // A reply of epoch 2 later than one interval is ignored as stale_reply, never as stale_epoch.
      expect((seen['renewed'] ?? 0) + (seen['stale_reply'] ?? 0)).toBe(beats - old);
      expect(holder.lease.mode()).toBe('valid');
    } finally {
      await holder.stop().catch(() => undefined);
      await nc.close();
    }
  });
});
