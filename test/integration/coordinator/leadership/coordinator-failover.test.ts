/**
 * The control plane survives losing a region, on the geo topology (regions a WAN apart, state replicated on the
 * three regions' servers): the leading coordinator's region is cut off; the standby in another region leads
 * within the stated time, with a higher epoch; the shares in force never sum above 1; the deposed coordinator's
 * admin writes are refused, and a record written with its epoch is refused by every agent and undone.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { systemClock } from '../../../../core/clock.js';
import { kvNames, policyKey } from '../../../../core/wire/kv.js';
import { AllocationRecord } from '../../../../core/wire/protocol.js';
import type { CoordinatorConfig } from '../../../../coordinator/config.js';
import { protocolEngine } from '../../../../coordinator/protocol/protocol-engine.js';
import { startCoordinator, type RunningCoordinator } from '../../../../coordinator/server.js';
import { LEADER_KEY, LeaderRecord } from '../../../../coordinator/leadership/leader-lease.js';
import { LeaseHolder } from '../../../../regional-agent/leases/lease-holder.js';
import { ConservationChecker } from '../../../harness/conservation-checker.js';
import { ADMIN_TOKEN, testConfig } from '../../../helpers/coordinator-fixture.js';
import { startGeoTopology } from '../../../helpers/geo-topology.js';
import { eventually } from '../../../helpers/wait.js';

/**
 * The coordinators' leader lease in this test, ms: the default, longer than JetStream's own elections (a heal
 * makes the streams elect again, a few seconds without a stream leader, which a shorter lease would not outlast).
 */
const LEADER_LEASE_MS = 10_000;
/**
 * Stated takeover bound (docs/coordinator.md, "High availability"): the lease counted from the leader's last
 * renewal to land, one poll of the standby (at most 1 s), and slack (3 s). A renewal in flight at the cut lands
 * only once the lease's stream has elected a leader among the regions left (4-9 s in nats-server 2.9 when the lost
 * region held it), and the standby, which cannot tell when it was sent, waits a lease from seeing it: 3 runs of
 * 29 (2026-12-06, the cut falling on a renewal) took the lease after 14 s, the bound when that wait was not
 * counted; the others 9.1-11.8 s.
 */
const JETSTREAM_ELECTION_MS = 9000;
const TAKEOVER_MS = JETSTREAM_ELECTION_MS + LEADER_LEASE_MS + 1000 + 3000;
/**
 * Then it opens the replicated state and starts the engine, and serves: within 15 s of taking the lease
 * (docs/protocol.md, "A new leader's start": about 6 round trips once the stream leaders of the regions left are
 * elected, which raft does within its 4-9 s election timeout of the cut, mostly before the lease lets the standby
 * in; each call that meets an election is tried again on its own after one NATS timeout at most; slack for two
 * loaded cores). Checked twice: from when this test sees the lease taken, and by the coordinator's own
 * `qp_coord_start_seconds`. Measured (qp_coord_start_seconds, 2026-12-06, two cores shared at a load of 6-14):
 * 0.25-1.59 s in 26 runs, the fixed path (no stream was still without a leader when the lease moved). Before,
 * the policies' and the demand snapshots' listings went through consumers (JetStream's meta leader): 2.1-5.1 s in
 * four runs that day, 3.0-11.7 s in eight the day before; and before each call was retried on its own (the whole
 * start was tried again after any failure) 4.6-39 s, and the test allowed 60 s.
 */
const SERVING_MS = 15_000;
/** Agents' lease settings that fit round trips of 220 ms (heartbeat replies must come back within an interval). */
const LEASE = { leaseMs: 3000, graceMs: 8000, skewMs: 250, reportIntervalMs: 500 };

/**
 * After the heal, a leader again within this (a stated bound, not a timing): JetStream's stream leaders elect again
 * when the cut server returns (nats-server 2.9's raft has no pre-vote: the returning server's higher term makes
 * the leaders of the regions left step down), measured 3-15 s and more on two cores under load. A lease renewal
 * that cannot land for a whole lease deposes the leader (it stops acting, as it must: it cannot tell this from
 * being cut off), its supervisor starts it again as a standby, and the standby leads a lease after JetStream
 * answers: re-elections (up to 30 s), lease (10 s), one poll (1 s), opening the state; 60 s in all.
 */
const LEADER_AGAIN_MS = 60_000;
/**
 * The leader's guard puts its own record back over the forged one within this: its compare-and-set lands once
 * JetStream answers, and a leader deposed meanwhile (its renewals failing for a lease) is followed by a standby a
 * lease later, which writes its epoch on every record as it starts.
 */
const RESTORED_MS = LEADER_AGAIN_MS + 3 * LEADER_LEASE_MS;

// It ran opt-in for a while (it failed 2 of 4 CI runs): the standby that led was deposed after the heal, when its
// lease renewals met JetStream's re-elections ("no responders") for longer than the lease, and the test took
// that leader for the only one. A deposed coordinator's supervisor starts it again as a standby (coordinator/
// main.ts exits with status 1 for that); the test does the same, and asserts what the product promises after the
// heal: a leader within LEADER_AGAIN_MS, of a higher epoch, followed by every agent. QP_TEST_FAILOVER=0 skips it.
describe.skipIf(process.env['QP_TEST_FAILOVER'] === '0')(
  'coordinator failover across regions',
  { timeout: 240_000 },
  () => {
    it('a standby in another region leads within the lease when the leader’s region is cut off; Σ ≤ 1; zombie writes refused', async () => {
      await using geo = await startGeoTopology({ redis: false });
      await geo.formed();
      const namespace = `f${Math.random().toString(36).slice(2, 10)}`;
      const config = (region: string, name: string): CoordinatorConfig => ({
        ...testConfig({ natsUrl: geo.natsUrl(region), regions: [...geo.regions], namespace }),
        natsTimeoutMs: 1500,
        replicas: 3,
        leader: { leaseMs: LEADER_LEASE_MS, name },
        logLevel: process.env['QP_TEST_LOG'] === '1' ? 'debug' : 'silent',
      });
      const engine = () => protocolEngine({ lease: LEASE, rebalance: { roundMs: 250 } });
      const coordinators: RunningCoordinator[] = [];
      const connections: NatsConnection[] = [];
      const holders: LeaseHolder[] = [];
      const registries = new Map<string, Registry>();
      const checker = new ConservationChecker();
      let poll: NodeJS.Timeout | undefined;
      const abort = new AbortController();
      try {
        // Placing three replicas needs every server current in JetStream: on a busy machine one may still lag just
        // after the cluster formed ("no suitable peers for placement"); start again until it places them.
        let first: RunningCoordinator | undefined;
        await eventually(
          async () => {
            first = await startCoordinator(config('us', 'us-1'), { engine: engine() }).catch(() => undefined);
            return first !== undefined;
          },
          20_000,
          'the first coordinator starts with three replicas',
          500,
        );
        if (first === undefined) throw new Error('unreachable');
        coordinators.push(first);
        expect(first.leader?.epoch).toBe(1);
        // The standby waits for the lease before it opens anything or listens. Supervised as main.ts is: one that
        // loses the lease stops, and a new standby starts in its region (eu-2, eu-3, …).
        let standby: RunningCoordinator | undefined;
        let standbyFailed: unknown;
        let generation = 0;
        const superviseEu = (): Promise<RunningCoordinator> => {
          generation++;
          const started = startCoordinator(config('eu', `eu-${generation}`), {
            engine: engine(),
            signal: abort.signal,
            onLeadershipLost: () => {
              if (abort.signal.aborted) return;
              void started.then((c) => c.stop()).catch(() => undefined);
              void superviseEu().catch(() => undefined);
            },
          });
          // A start that fails (the lease lost while opening the state) is started again, as a supervisor does.
          started.then(
            (c) => coordinators.push(c),
            () => {
              if (!abort.signal.aborted)
                setTimeout(() => void superviseEu().catch(() => undefined), 500).unref();
            },
          );
          return started;
        };
        const standbyStarted = superviseEu().then((c) => (standby = c));
        standbyStarted.catch((error: unknown) => (standbyFailed = error));
        /** The supervised coordinator that leads now, if one does. */
        const leading = (): RunningCoordinator | undefined =>
          coordinators.find((c) => c !== first && c.leader?.isLeader() === true);

        const put = await fetch(`${first.url}/v1/policies/p`, {
          method: 'PUT',
          headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
          body: JSON.stringify({ capacity: 100, refillPerSecond: 10 }),
        });
        expect(put.status).toBe(201);

        for (const region of geo.regions) {
          const nc = await connect({
            servers: geo.natsUrl(region),
            maxReconnectAttempts: -1,
            reconnectTimeWait: 100,
          });
          connections.push(nc);
          const registry = new Registry();
          registries.set(region, registry);
          const holder = new LeaseHolder({
            nc,
            region,
            instance: `${region}-agent`,
            clock: systemClock,
            namespace,
            skewMs: 250,
            startupWaitMs: 1000,
            timeoutMs: 1500,
            registry,
          });
          checker.watch(`${region}-agent`, region, holder.lease);
          holders.push(holder);
          await holder.start();
        }
        poll = setInterval(() => {
          for (const h of holders) h.lease.poll();
        }, 20);
        await eventually(
          () => holders.every((h) => h.lease.mode() === 'valid' && h.lease.shareFor('p', '') !== undefined),
          20_000,
          'every agent holds a lease from the first coordinator',
        );
        expect(holders.every((h) => h.leaderEpoch === 1)).toBe(true);
        expect(standby).toBeUndefined();

        // The leader's region is cut off: its coordinator cannot renew, and steps down.
        await geo.partition('us');
        const cutAt = performance.now();
        // Leading is holding the lease, seen from outside (a client of eu reads the lease bucket).
        const leaderKv = await new Kvm(jetstream(connections[1]!)).open(kvNames(namespace).leader);
        await eventually(
          async () => {
            const entry = await leaderKv.get(LEADER_KEY).catch(() => null);
            const value = entry === null ? undefined : LeaderRecord.parse(entry.json());
            return value?.holder === 'eu-1' && value.epoch === 2;
          },
          TAKEOVER_MS,
          'the standby leads within the stated time',
        );
        const tookMs = performance.now() - cutAt;
        // Then it opens the replicated state and answers (JetStream may still be electing: calls are retried).
        await eventually(
          () => standby !== undefined || standbyFailed !== undefined,
          SERVING_MS,
          'the new leader serves',
        );
        expect(standbyFailed).toBeUndefined();
        const servingMs = performance.now() - cutAt;
        const second = await standbyStarted;
        expect(second.leader?.epoch).toBe(2);
        // The new leader's own count, from taking the lease to serving (coordinator/start-steps.ts).
        const startMetric = await second.app.metrics.registry
          .getSingleMetric('qp_coord_start_seconds')
          ?.get();
        const startMs = (startMetric?.values[0]?.value ?? Infinity) * 1000;
        expect(startMs).toBeLessThanOrEqual(SERVING_MS);
        const stepMetric = await second.app.metrics.registry
          .getSingleMetric('qp_coord_start_step_seconds')
          ?.get();
        const slowest = [...(stepMetric?.values ?? [])]
          .sort((a, b) => b.value - a.value)
          .slice(0, 3)
          .map((v) => `${String(v.labels['step'])} ${Math.round(v.value * 1000)}`)
          .join(', ');
        expect(first.leader?.isLeader()).toBe(false);
        expect(first.leader?.lost).toBe('expired');

        // The deposed coordinator (a zombie for as long as its region is cut off) changes nothing.
        const zombieWrite = await fetch(`${first.url}/v1/policies/p/budget`, {
          method: 'PATCH',
          headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
          body: JSON.stringify({ capacity: 500 }),
        });
        expect(zombieWrite.status).toBe(503);
        expect(((await zombieWrite.json()) as { code: string }).code).toBe('COORD_ERR_NOT_LEADER');

        // The agents of the two regions left renew with the new leader and adopt its epoch.
        const far = holders.filter((_, i) => geo.regions[i] !== 'us');
        await eventually(
          () => far.every((h) => h.leaderEpoch === 2 && h.lease.mode() === 'valid'),
          15_000,
          'the agents of eu and ap follow the new leader',
        );

        await geo.heal('us');
        const healedAt = performance.now();
        // JetStream elects again after the heal; the leader may be deposed meanwhile and a new standby lead.
        let epoch = 0;
        await eventually(
          () => {
            epoch = leading()?.leader?.epoch ?? 0;
            return epoch >= 2 && holders.every((h) => h.leaderEpoch === epoch && h.lease.mode() === 'valid');
          },
          LEADER_AGAIN_MS,
          'a leader after the heal, of epoch 2 or above, whom every agent (us included) renews with',
          50,
        );
        const againMs = performance.now() - healedAt;

        // A record of the old epoch (what a zombie's write would carry) is refused by every agent and undone.
        const kv = await new Kvm(jetstream(connections[1]!)).open(kvNames(namespace).allocations);
        // JetStream settles after the heal (the returning server catches up): read once it answers with a record of
        // epoch 2 or above. Just after the heal the returning server may still answer as the stream leader it was
        // before the cut, with the record it held then (epoch 1), until it hears of the election it missed: 3 runs
        // in 24 read epoch 1 here while every agent held epoch 2, and in the one that read again, the read 0.3 s
        // later had epoch 2. A stored record of epoch 1 would keep this from ever passing.
        let current: AllocationRecord | undefined;
        let staleReads = 0;
        const readMs = await eventually(
          async () => {
            const entry = await kv.get(policyKey('p')).catch(() => null);
            current = entry === null ? undefined : AllocationRecord.parse(entry.json());
            if (current !== undefined && (current.leaderEpoch ?? 0) < 2) staleReads++;
            return (current?.leaderEpoch ?? 0) >= 2;
          },
          LEADER_AGAIN_MS,
          'the allocation record of epoch 2 or above can be read after the heal',
        );
        const record = current!;
        const shares = Object.fromEntries(geo.regions.map((r) => [r, r === 'us' ? 1 : 0]));
        const before = holders.map((h) => h.lease.shareFor('p', '')?.share);
        // JetStream may still be settling after the heal: write until it takes the record.
        await eventually(
          () =>
            kv
              .put(
                policyKey('p'),
                JSON.stringify({
                  ...record,
                  leaderEpoch: 1,
                  epoch: record.epoch + 1,
                  default: { ...record.default, shares },
                }),
              )
              .then(
                () => true,
                () => false,
              ),
          LEADER_AGAIN_MS,
          'the old epoch’s record is written',
        );
        await eventually(
          async () => {
            for (const registry of registries.values()) {
              const m = await registry
                .getSingleMetric('quotaplane_agent_allocation_stale_epoch_records_total')
                ?.get();
              if ((m?.values[0]?.value ?? 0) < 1) return false;
            }
            return true;
          },
          10_000,
          'every agent refuses the old epoch’s record',
        );
        expect(holders.map((h) => h.lease.shareFor('p', '')?.share)).toEqual(before);
        const restoredMs = await eventually(
          async () => {
            const entry = await kv.get(policyKey('p')).catch(() => null);
            const own = leading()?.leader?.epoch;
            return (
              entry !== null && own !== undefined && AllocationRecord.parse(entry.json()).leaderEpoch === own
            );
          },
          // Liveness, after the safety checks above: the guard's compare-and-set waits for JetStream to settle after
          // the heal (its stream leaders elected again), 5-30 s measured, once beyond 30 s in CI, and once beyond
          // 60 s on the containers backend (2026-12-07, no state recorded): a leader deposed meanwhile takes a
          // lease to lose and a lease for its successor to lead. On failure the message says where each
          // coordinator and the record stood.
          RESTORED_MS,
          'the leader’s guard writes its own record back',
          50,
        ).catch(async (error: unknown) => {
          throw new Error(`${String(error)}; ${await whereThingsStand(coordinators, kv)}`);
        });

        expect(leading()).toBeDefined();
        expect(leading()!.leader!.epoch).toBeGreaterThanOrEqual(2);
        // Never two leaders: the deposed first coordinator stays deposed, and of the supervised ones one leads.
        expect(first.leader?.isLeader()).toBe(false);
        expect(coordinators.filter((c) => c.leader?.isLeader() === true)).toHaveLength(1);
        checker.assertHeld();
        expect(checker.events).toBeGreaterThan(0);
        console.log(
          `standby led ${Math.round(tookMs)} ms and served ${Math.round(servingMs)} ms after the cut (its start: ${Math.round(startMs)} ms, slowest steps ${slowest}); after the heal a leader (epoch ${epoch}, ${generation} eu standbys started) followed by every agent within ${Math.round(againMs)} ms, its record read ${Math.round(readMs)} ms later (${staleReads} reads of epoch 1 first), the forged record undone ${Math.round(restoredMs)} ms after it was seen refused; max Σ ${checker.maxSum.get('p')}`,
        );
      } finally {
        abort.abort();
        clearInterval(poll);
        for (const h of holders) await h.stop().catch(() => undefined);
        for (const nc of connections) await nc.close().catch(() => undefined);
        for (const c of coordinators.reverse()) await c.stop().catch(() => undefined);
      }
    });
  },
);

/** For a failure message: each coordinator's lease and allocation writes, and the record the bucket holds. */
async function whereThingsStand(
  coordinators: readonly RunningCoordinator[],
  kv: { get(key: string): Promise<{ revision: number; json<T>(): T } | null> },
): Promise<string> {
  const parts: string[] = [];
  for (const c of coordinators) {
    const registry = c.app.metrics.registry;
    const writes = await registry.getSingleMetric('quotaplane_allocation_writes_total')?.get();
    const foreign = await registry.getSingleMetric('qp_coord_kv_foreign_writes_total')?.get();
    const byOutcome = (writes?.values ?? [])
      .map((v) => `${String(v.labels['outcome'])} ${String(v.value)}`)
      .join(' ');
    const found = (foreign?.values ?? []).reduce((n, v) => n + v.value, 0);
    parts.push(
      `coordinator epoch ${String(c.leader?.epoch)} leads ${String(c.leader?.isLeader())} lost ${String(c.leader?.lost)}: writes ${byOutcome || 'none'}, foreign ${String(found)}`,
    );
  }
  const entry = await kv.get(policyKey('p')).catch((error: unknown) => String(error));
  const record =
    entry === null
      ? 'no record'
      : typeof entry === 'string'
        ? `record unreadable (${entry})`
        : `record revision ${String(entry.revision)} of epoch ${String(entry.json<{ leaderEpoch?: number }>().leaderEpoch)}`;
  return `${parts.join('; ')}; ${record}`;
}
