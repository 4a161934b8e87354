import { grpcSuite } from './grpc.bench.js';
import { hotkeySuite } from './hotkey.bench.js';
import { httpSuite } from './http.bench.js';
import type { BenchSuite } from './lib.js';
import { serviceSuite } from './service.bench.js';
import { simSuite } from './sim.bench.js';
import { rebalanceSuite } from './rebalance.bench.js';
import { storeSuite } from './store.bench.js';
import { strictSuite } from './strict.bench.js';

/** Every benchmark suite, in the order `npm run bench` runs them. */
export const suites: BenchSuite[] = [
  storeSuite,
  httpSuite,
  grpcSuite,
  simSuite,
  rebalanceSuite,
  strictSuite,
  hotkeySuite,
  serviceSuite,
];
