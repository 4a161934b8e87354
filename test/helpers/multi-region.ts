/**
 * The old name of the stack fixture, kept for test/integration/scripts/stack/geo-acceptance.test.ts:
 * `new MultiRegion(options).start()` is `startStack(options)` (test/helpers/fixture/). New tests import from the
 * fixture.
 */
export {
  decide,
  ServiceStack as MultiRegion,
  STRICT_REFUNDS,
  type ServiceAgent as RegionAgent,
  type ServiceStackOptions as MultiRegionOptions,
} from './fixture/index.js';
