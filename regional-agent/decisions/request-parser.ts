import { MAX_CHECKS_PER_REQUEST, readDecisionBody, type DecisionRequest } from '../../core/wire/agent.js';
import { AgentErrors, withProblems } from '../errors.js';

/**
 * Validate a `POST /v1/decisions` body: every problem of the kind found first is listed. Throws an agent error;
 * changes nothing. Valid bodies take the hand-written check (proven equal to the zod schema) and skip zod; the
 * code of a refusal is core's (`readDecisionBody`), which the client also refuses with when it answers for the
 * agent.
 */
export function parseDecisionRequest(body: unknown): DecisionRequest {
  const read = readDecisionBody(body);
  if (read.ok) return read.request;
  if (read.code === 'AGT_ERR_TOO_MANY_CHECKS')
    throw new AgentErrors.AGT_ERR_TOO_MANY_CHECKS(MAX_CHECKS_PER_REQUEST, read.checks);
  throw withProblems(new AgentErrors[read.code](read.problems.join('; ')), read.problems);
}
