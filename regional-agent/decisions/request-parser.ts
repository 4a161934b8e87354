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
  const { issues } = parsed.error;
  const problems = issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
  const field = (i: (typeof issues)[number]) => i.path[i.path.length - 1];
  // A subject of text the wire bounds refuse (empty, longer than MAX_WIRE_SUBJECT_LENGTH) is refused as the agent
  // refuses any other subject it cannot key, AGT_ERR_INVALID_SUBJECT: the caller's input, not a malformed body (a
  // service's plugin answers it with a 400, not as its own misconfiguration). A subject that is not text is.
  const subjectIssue = issues.some(
    (i) => field(i) === 'subject' && (i.code === 'too_big' || i.code === 'too_small'),
  );
  const error = issues.some((i) => field(i) === 'cost')
    ? new AgentErrors.AGT_ERR_INVALID_COST(problems.join('; '))
    : subjectIssue
      ? new AgentErrors.AGT_ERR_INVALID_SUBJECT(problems.join('; '))
      : new AgentErrors.AGT_ERR_INVALID_REQUEST(problems.join('; '));
  throw withProblems(error, problems);
}
