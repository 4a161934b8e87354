/** Counters of the lease coordinator, which the shell exports as metrics. */
export interface EngineCounters {
  rounds: number;
  shrinks: number;
  grows: number;
  safetyShrinks: number;
  overridesCreated: number;
  overridesRemoved: number;
  renewalsRefused: number;
  messagesDropped: number;
  /** Agents forgotten after `forgetAfterMs` of silence. */
  agentsForgotten: number;
  /** Learning mode ended before its full lease + skew: every registered agent held a renewal of this incarnation. */
  learningEndedEarly: number;
}

/** Every counter at zero. */
export function zeroCounters(): EngineCounters {
  return {
    rounds: 0,
    shrinks: 0,
    grows: 0,
    safetyShrinks: 0,
    overridesCreated: 0,
    overridesRemoved: 0,
    renewalsRefused: 0,
    messagesDropped: 0,
    agentsForgotten: 0,
    learningEndedEarly: 0,
  };
}
