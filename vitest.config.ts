import { defineConfig } from 'vitest/config';

// Three tiers: `unit` is pure (no server, no socket beyond Fastify's inject) and starts nothing; `integration`
// runs against real Redis and NATS processes that its global setup starts on free loopback ports; `wall-clock`
// holds the tests whose figures are wall-clock behaviour of a whole stack (the real-stack replay compares its
// utilisation with the simulator's prediction), run alone after the others so no other file competes for the
// two cores while they measure. `npm run test:unit` runs the first alone; `npm test` runs all three.
// The coordinator failover waits on JetStream's elections across proxied links: its bounds hold on a machine
// whose two cores it does not share with other files (it failed beside two others and passed alone, 46 s).
const WALL_CLOCK = [
  'test/integration/simulations/replay/sim-replay.test.ts',
  'test/integration/simulations/replay/sim-replay-geo.test.ts',
  'test/integration/scripts/stack/geo-acceptance.test.ts',
  'test/integration/coordinator/leadership/coordinator-failover.test.ts',
  // A freshly started agent's first burst of 2,000 through the client's default 300 ms timeout: beside another
  // file on the two cores, two of its exchanges (128 decisions) were answered later than the timeout.
  'packages/client/test/integration/client-cold-start.test.ts',
  // A silent strict home through the client's timeout (the agent's bound plus 50 ms): beside another file's burst,
  // one run in five had an exchange answered later than the timeout.
  'test/integration/regional-agent/strict/strict-answer-within.test.ts',
];

// Files that never ask the test backend for a server: they run `npm start` (or the replay that starts it), whose
// servers are the host's binaries on either backend (QP_STACK_SERVERS=auto). On the containers backend
// (QP_TEST_BACKEND=containers, the second pass of .ci/run) they would repeat the first pass's work to the byte,
// about 4 minutes; `npm start` with containerized servers is the CI's docker step's own check.
const HOST_SERVERS_ONLY = [
  'test/integration/scripts/stack/stack-launcher.test.ts',
  'test/integration/docs/docs-examples.test.ts',
  'test/integration/simulations/replay/sim-replay-geo.test.ts',
];
const skipOnContainers = process.env['QP_TEST_BACKEND'] === 'containers' ? HOST_SERVERS_ONLY : [];

export default defineConfig({
  test: {
    testTimeout: 20_000,
    hookTimeout: 30_000,
    // Integration tests hold real servers: keep parallelism to the machine's two cores.
    maxWorkers: 2,
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts', 'packages/client/test/unit/**/*.test.ts'],
          sequence: { groupOrder: 0 },
          // Pure tests share each worker's module cache: importing core/, the agent and the simulator once per
          // worker rather than once per file took 24 of the tier's 42 s on two cores (15 s without; the files
          // also pass shuffled, so none depends on another's module state).
          isolate: false,
        },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts', 'packages/client/test/integration/**/*.test.ts'],
          exclude: [...WALL_CLOCK, ...skipOnContainers],
          globalSetup: ['test/harness/global-setup.ts'],
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'wall-clock',
          include: WALL_CLOCK,
          exclude: skipOnContainers,
          fileParallelism: false,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
