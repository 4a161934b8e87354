// The client's build: ESM and CommonJS bundles with their declarations, for Node 20.19+. tsdown (rolldown
// underneath) bundles the wire contract from core/ into the package, so it ships no copy to keep in step and
// needs none of the agent's code at run time; npm dependencies (zod, opossum, fastify-plugin) stay external.
import { defineConfig } from 'tsdown';

export default defineConfig({
  entry: { index: 'src/index.ts', fastify: 'src/fastify.ts' },
  format: ['esm', 'cjs'],
  platform: 'node',
  target: 'node20.19',
  dts: true,
  clean: true,
  tsconfig: 'tsconfig.json',
  report: false,
  inputOptions: { checks: { pluginTimings: false } },
});
