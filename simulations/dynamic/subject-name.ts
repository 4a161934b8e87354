/** Names of the first subject ids, built once: every decision reports its subject by name. */
const cached: string[] = [];
const CACHED = 1 << 16;

/** The subject string an agent reports for a simulated subject id (a normalized subject, never an identity). */
export function subjectName(subject: number): string {
  if (subject >= CACHED) return `s${subject}`;
  return (cached[subject] ??= `s${subject}`);
}

/** The simulated subject id of a name `subjectName` made. */
export function subjectId(name: string): number {
  return Number(name.slice(1));
}
