import {
  LayeredDecisionRequest,
  MAX_CHECKS_PER_REQUEST,
  SingleDecisionRequest,
  looksValidDecisionRequest,
  type DecisionRequest,
} from '../../core/wire/agent.js';
import { AgentErrors, withProblems } from '../errors.js';

/**
 * Validate a `POST /v1/decisions` body: every problem of the kind found first is listed. Throws an agent error;
 * changes nothing. Valid bodies take the hand-written check (proven equal to the zod schema) and skip zod.
 */
export function parseDecisionRequest(body: unknown): DecisionRequest {
  if (looksValidDecisionRequest(body)) return body;
  const layered = typeof body === 'object' && body !== null && 'checks' in body;
  if (layered) {
    const checks = body.checks;
    if (Array.isArray(checks) && checks.length > MAX_CHECKS_PER_REQUEST) {
      throw new AgentErrors.AGT_ERR_TOO_MANY_CHECKS(MAX_CHECKS_PER_REQUEST, checks.length);
    }
  }
  const parsed = (layered ? LayeredDecisionRequest : SingleDecisionRequest).safeParse(body);
  if (parsed.success) return parsed.data;
  const problems = parsed.error.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
  const costIssue = parsed.error.issues.some((i) => i.path[i.path.length - 1] === 'cost');
  const error = costIssue
    ? new AgentErrors.AGT_ERR_INVALID_COST(problems.join('; '))
    : new AgentErrors.AGT_ERR_INVALID_REQUEST(problems.join('; '));
  throw withProblems(error, problems);
}
