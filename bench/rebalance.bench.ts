/**
 * Time of one coordinator round (LeaseCoordinator.tick) for 10k regional policies across 5 regions in which every
 * policy's shares move (the worst case: every policy rebalances), after demand has lasted long enough to move them. No peer does this job;
 * the figure is compared with the goal of 50 ms (ratio = goal / ours, > 1 is better than the goal). Measured as
 * CPU time of the round, so load from other processes does not inflate it.
 */
import { ManualClock } from '../core/clock.js';
import { LeaseCoordinator } from '../core/lease/lease-coordinator.js';
import { parsePolicy } from '../core/policy/policy.js';
import { median, type BenchSuite } from './lib.js';

const POLICIES = 10_000;
const REGIONS = ['us', 'eu', 'ap', 'sa', 'af'];
const GOAL_MS = 50;

export const rebalanceSuite: BenchSuite = {
  name: 'rebalance',
  run({ rounds }, progress) {
    const clock = new ManualClock(1_750_000_000_000);
    const engine = new LeaseCoordinator({ coordinatorId: 'bench', regions: REGIONS, clock });
    const names = Array.from({ length: POLICIES }, (_, i) => `p${i}`);
    for (const name of names) engine.upsertPolicy(parsePolicy({ name, capacity: 1000, refillPerSecond: 10 }));
    const agents = REGIONS.map((region) => ({ agentId: `agent-${region}-bench`, region }));
    let revision = 0;
    const persist = () => {
      for (const w of engine.takeWrites()) engine.written(w.policy, w.seq, ++revision);
    };
    let seq = 0;
    const beat = () => {
      // Each agent holds the renewal of its previous heartbeat.
      seq++;
      for (const a of agents) {
        engine.heartbeat({
          ...a,
          instance: a.agentId,
          seq,
          appliedRevision: revision,
          ackRevision: revision,
          mode: 'valid',
          renewedSeq: seq - 1,
        });
      }
    };
    persist();
    // Past learning mode, with every agent acknowledging everything as soon as it is written.
    for (let t = 0; t < 10; t++) {
      clock.advance(1000);
      beat();
      engine.tick();
      persist();
    }
    // Demand lasts: shares move only once it has held for the confirmation time (core/rebalance/settings.ts
    // confirmMs), then step toward it by at most maxStep a round. One region is hot for every policy; rounds
    // run unmeasured until the first move, then each measured round moves every policy's shares one step.
    const report = (round: number) => {
      for (const [i, a] of agents.entries()) {
        const policies = names.map((policy) => ({
          policy,
          requested: i === 0 ? 900 : 25,
          admitted: 0,
          denied: 0,
          constrained: [],
        }));
        for (let chunk = 0; chunk < policies.length; chunk += 512) {
          engine.usage({
            ...a,
            seq: round,
            intervalMs: 1000,
            chunk: 0,
            chunks: 1,
            policies: policies.slice(chunk, chunk + 512),
            dropped: 0,
          });
        }
      }
    };
    const moves = () => engine.counters.shrinks + engine.counters.grows;
    const round = () => {
      clock.advance(1000);
      report(seq);
      beat();
      const before = moves();
      // CPU time of this thread, not wall time: other processes on the machine do not inflate it.
      const start = process.cpuUsage();
      engine.tick();
      const used = process.cpuUsage(start);
      persist();
      beat();
      return { ms: (used.user + used.system) / 1000, moved: moves() - before };
    };
    let waited = 0;
    while (moves() === 0 && waited < 300) {
      round();
      waited++;
    }
    const times: number[] = [];
    const moved: number[] = [];
    const measured = Math.max(5, rounds * 3);
    while (times.length < measured) {
      const r = round();
      if (r.moved === 0) break;
      times.push(r.ms);
      moved.push(r.moved);
    }
    if (times.length < measured) {
      throw new Error(`rebalance bench: shares stopped moving after ${times.length} of ${measured} rounds`);
    }
    const ms = median(times);
    progress(
      `  rebalance: first move after ${waited} rounds; ${measured} rounds, median ${ms.toFixed(1)} ms, rounds: ${times.map((t) => t.toFixed(1)).join(' ')}; moves per round: ${moved.join(' ')}`,
    );
    return Promise.resolve([
      {
        bench: `rebalance round ms (${POLICIES / 1000}k policies x ${REGIONS.length} regions)`,
        ours: Number(ms.toFixed(1)),
        peer: 'goal',
        peerValue: GOAL_MS,
        ratio: Number((GOAL_MS / ms).toFixed(2)),
        details: { movesPerRound: median(moved), roundsBeforeTheFirstMove: waited },
      },
    ]);
  },
};
