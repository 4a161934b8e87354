/**
 * Simulated decisions per second on one core. `ours` is the simulator's bucket-only path (RegionStore.decide:
 * core refill/settle on subject ids, checks encoded once per share); the peer is core's general BucketModel
 * (string keys, TTL records, arrays per call) on the same arrivals. The full engine (arrivals, the ideal oracle
 * deciding every request too, network, metrics) on `uniform` under `static` is reported beside them.
 */
import { bucketKey } from '../core/keys.js';
import { parsePolicy } from '../core/policy/policy.js';
import { BucketModel, type EncodedRequest } from '../core/models/token-bucket.js';
import { BucketSizing } from '../simulations/engine/bucket-sizing.js';
import { Random } from '../simulations/engine/random.js';
import { RegionStore } from '../simulations/engine/region-store.js';
import { runSimulation } from '../simulations/engine/run.js';
import { findScenario } from '../simulations/scenarios/catalogue.js';
import { DEFAULT_SETTINGS, resolveSettings } from '../simulations/settings.js';
import { findStrategy } from '../simulations/strategies/registry.js';
import { alternate, median, type BenchSuite } from './lib.js';

const SUBJECTS = 10_000;
const ARRIVALS = 1 << 20;
/** Mean gap between arrivals, µs: 100k decisions per virtual second over 10k subjects, mostly admitted. */
const MEAN_GAP_US = 10;

/** Run `step(i)` back to back for `seconds` of wall time; decisions per second. */
function timed(seconds: number, step: (i: number) => void): number {
  const start = performance.now();
  const deadline = start + seconds * 1000;
  let i = 0;
  for (;;) {
    for (let k = 0; k < 4096; k++) step(i++);
    if (performance.now() >= deadline) break;
  }
  return i / ((performance.now() - start) / 1000);
}

export const simSuite: BenchSuite = {
  name: 'sim',
  async run({ seconds, rounds }, progress) {
    const policy = parsePolicy({ name: 'sim', capacity: 100, refillPerSecond: 2 });
    const sizing = new BucketSizing(policy, 1 / 3);
    const check = sizing.check(1, 0);
    const random = new Random(1, 'bench');
    const subjects = new Int32Array(ARRIVALS);
    const gaps = new Float64Array(ARRIVALS);
    for (let i = 0; i < ARRIVALS; i++) {
      subjects[i] = random.int(SUBJECTS);
      gaps[i] = Math.max(1, Math.round(random.exponential(MEAN_GAP_US)));
    }
    const keys = Array.from({ length: SUBJECTS }, (_, s) => bucketKey(1, `s${s}`, 'sim'));
    const requests: EncodedRequest[] = keys.map((key) => ({ keys: [key], checks: [check], dryRun: false }));

    // Time keeps moving forward across laps over the arrivals, as in a long run.
    const bucketPath = () => {
      const store = new RegionStore('bench');
      let now = 0;
      let admitted = 0;
      const rate = timed(seconds, (i) => {
        const k = i & (ARRIVALS - 1);
        now += gaps[k]!;
        if (store.decide(subjects[k]!, check, now).allowed) admitted++;
      });
      if (admitted === 0) throw new Error('bench: nothing admitted');
      return Promise.resolve(rate);
    };
    const model = () => {
      const m = new BucketModel();
      let now = 0;
      let admitted = 0;
      const rate = timed(seconds, (i) => {
        const k = i & (ARRIVALS - 1);
        now += gaps[k]!;
        if (m.evaluate(requests[subjects[k]!]!, now).allowed) admitted++;
      });
      if (admitted === 0) throw new Error('bench: nothing admitted');
      return Promise.resolve(rate);
    };
    const scenario = findScenario('uniform')!;
    const engine = () => {
      const settings = resolveSettings(DEFAULT_SETTINGS, scenario.defaults, {
        subjects: 1000,
        load: 10,
        durationS: 60,
      });
      const start = performance.now();
      const { decisions } = runSimulation({
        scenario,
        strategy: findStrategy('static')!,
        regionCount: 3,
        seed: 1,
        settings,
      });
      return Promise.resolve(decisions / ((performance.now() - start) / 1000));
    };

    progress('sim: warming up');
    await bucketPath();
    await model();
    await engine();
    const runs = await alternate({ ours: bucketPath, peer: model, engine }, rounds, progress);
    const o = median(runs.ours);
    const p = median(runs.peer);
    return [
      {
        bench: 'simulated decisions/s, bucket path (1 core, 10k subjects)',
        ours: Math.round(o),
        peer: 'core BucketModel.evaluate',
        peerValue: Math.round(p),
        ratio: Number((o / p).toFixed(2)),
        details: {
          oursRuns: runs.ours.map(Math.round),
          peerRuns: runs.peer.map(Math.round),
          fullEngine: Math.round(median(runs.engine)),
          fullEngineRuns: runs.engine.map(Math.round),
          fullEngineNote:
            'uniform, static, 3 regions, 1000 subjects at 10x budget, 1.2M requests, oracle included',
        },
      },
    ];
  },
};
