/**
 * Subjects of usage reports that no allocation record can hold (core/wire/protocol.ts `isRecordableSubject`: a
 * subject named `__proto__`), left out where the coordinator reads a report, before the lease coordinator sees
 * it: such a subject is never tracked, never watched and never gets an override, so no record it would make
 * unreadable to every agent is ever written. The policy's own figures in the report (requested, admitted,
 * denied, demand) still count whole.
 */
import { isRecordableSubject, type PolicyUsage, type Usage } from '../../core/wire/protocol.js';

/** `usage` without the subjects no record can hold, and how many entries were left out (0: `usage` itself). */
export function recordableUsage(usage: Usage): { usage: Usage; dropped: number } {
  const unrecordable = (s: { subject: string }) => !isRecordableSubject(s.subject);
  if (
    !usage.policies.some((p) => p.constrained.some(unrecordable) || (p.watched?.some(unrecordable) ?? false))
  )
    return { usage, dropped: 0 };
  let dropped = 0;
  const keep = <T extends { subject: string }>(list: readonly T[]): T[] => {
    const kept = list.filter((s) => isRecordableSubject(s.subject));
    dropped += list.length - kept.length;
    return kept;
  };
  const policies = usage.policies.map((p): PolicyUsage => ({
    ...p,
    constrained: keep(p.constrained),
    ...(p.watched === undefined ? {} : { watched: keep(p.watched) }),
  }));
  return { usage: { ...usage, policies }, dropped };
}
