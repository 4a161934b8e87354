/** Protocol messages as an agent sends them, for tests that play an agent (or forge one). */
import type { Heartbeat } from '../../core/wire/protocol.js';

/** A first heartbeat (seq 0, nothing applied, no renewal yet) of `agentId` in `region`. */
export function firstHeartbeat(
  agentId: string,
  region: string,
  options: { instance?: string; mode?: Heartbeat['mode'] } = {},
): Heartbeat {
  return {
    agentId,
    instance: options.instance ?? agentId,
    region,
    seq: 0,
    appliedRevision: 0,
    ackRevision: 0,
    mode: options.mode ?? 'valid',
    renewedSeq: -1,
  };
}
