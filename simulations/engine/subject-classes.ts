/**
 * Subject classes in the simulator (docs/subject-classes.md): the policy as each simulated subject sees it, its
 * class's capacity and refill when the policy's `subjects` names one (core/policy/policy.ts `withClass`), else the
 * policy itself. Every strategy, the ideal oracle and the over-admission measure size a subject by it.
 */
import { ownValue } from '../../core/own-keys.js';
import { withClass, type Policy } from '../../core/policy/policy.js';
import type { Settings } from '../settings.js';
import { subjectName } from '../dynamic/subject-name.js';

/** The class the simulator gives its enterprise subjects (`enterpriseSubjects`, `enterpriseFactor`). */
export const ENTERPRISE_CLASS = 'enterprise';

/** The ids of the enterprise subjects: the last `enterpriseSubjects` of the run's `subjects`. */
export function enterpriseSubjectIds(s: Pick<Settings, 'subjects' | 'enterpriseSubjects'>): number[] {
  const n = Math.min(s.enterpriseSubjects ?? 0, s.subjects);
  return Array.from({ length: n }, (_, i) => s.subjects - n + i);
}

/**
 * The policy fields of the enterprise class: C × factor, R × factor, the run's maxCost; none without enterprise
 * subjects.
 */
export function enterpriseClassFields(
  s: Pick<
    Settings,
    'subjects' | 'enterpriseSubjects' | 'enterpriseFactor' | 'capacity' | 'refillPerSecond' | 'maxCost'
  >,
):
  | {
      classes: Record<string, { capacity: number; refillPerSecond: number; maxCost: number }>;
      subjects: Record<string, string>;
    }
  | undefined {
  const ids = enterpriseSubjectIds(s);
  if (ids.length === 0) return undefined;
  const f = s.enterpriseFactor ?? 1;
  return {
    classes: {
      [ENTERPRISE_CLASS]: {
        capacity: s.capacity * f,
        refillPerSecond: s.refillPerSecond * f,
        maxCost: s.maxCost,
      },
    },
    subjects: Object.fromEntries(ids.map((id) => [subjectName(id), ENTERPRISE_CLASS])),
  };
}

/** The policy each subject sees, one object per class. */
export class SubjectPolicies {
  readonly policy: Policy;
  readonly #byClass = new Map<string, Policy>();

  constructor(policy: Policy) {
    this.policy = policy;
  }

  /** The class of `subject`, undefined for the policy's own limits. */
  classOf(subject: number): string | undefined {
    return ownValue(this.policy.subjects, subjectName(subject));
  }

  /** The policy as `subject` sees it (the policy itself when it has no class). */
  of(subject: number): Policy {
    const name = this.classOf(subject);
    if (name === undefined) return this.policy;
    let p = this.#byClass.get(name);
    if (p === undefined) {
      p = withClass(this.policy, name);
      this.#byClass.set(name, p);
    }
    return p;
  }
}
