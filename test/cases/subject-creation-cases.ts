/**
 * The creation-log case table: every case runs against the reference model (`CreationLogModel`,
 * core/models/subject-creation.ts) and against `lua/subject_creation.lua` on a real Redis, and the two must return
 * identical replies and hold identical entries. Steps carry virtual time (`at`, ms since the case began); every
 * step pins the reply we promise, and the members the log holds in its window after it.
 */
import type { CreationOutcome, CreationRequest } from '../../core/models/subject-creation.js';

export interface CreationCaseStep {
  at: number;
  /** The subject asking (its bucket key is the member). */
  subject: string;
  dryRun?: boolean;
  /** Repeat n times at the same instant (default 1); `expect` applies to every one. */
  repeat?: number;
  expect: {
    outcome: CreationOutcome;
    remaining: number;
    retryAfterMs: number;
    /** Members in the window after the step. */
    entries: number;
  };
}

export interface CreationCase {
  name: string;
  /** Creations per window (default 3). */
  limit?: number;
  steps: CreationCaseStep[];
}

/** Virtual Redis time at which every case starts, in µs. */
export const CREATION_CASE_EPOCH_MICROS = 1_750_000_000_000_000;
/** The window of the cases: shorter than the cap's minute, so leaving it is a step away. */
export const CASE_WINDOW_MS = 10_000;

const taken = (remaining: number, entries: number) =>
  ({ outcome: 'taken', remaining, retryAfterMs: 0, entries }) as const;
const held = (remaining: number, entries: number) =>
  ({ outcome: 'held', remaining, retryAfterMs: 0, entries }) as const;
const full = (retryAfterMs: number, entries: number) =>
  ({ outcome: 'full', remaining: 0, retryAfterMs, entries }) as const;

export const subjectCreationCases: CreationCase[] = [
  {
    name: 'a subject costs one creation however often it asks; others take theirs until the cap is used up',
    steps: [
      { at: 0, subject: 'a', expect: taken(2, 1) },
      { at: 0, subject: 'a', repeat: 20, expect: held(2, 1) },
      { at: 100, subject: 'b', expect: taken(1, 2) },
      { at: 200, subject: 'a', expect: held(1, 2) },
      { at: 300, subject: 'c', expect: taken(0, 3) },
      // The oldest creation (a, at 0) leaves at 10,000 ms: 9,700 ms from 300.
      { at: 300, subject: 'd', expect: full(9700, 3) },
      { at: 400, subject: 'b', expect: held(0, 3) },
    ],
  },
  {
    name: 'the burst of one new subject, then a flood of others: exactly 1 + (limit - 1) creations',
    limit: 5,
    steps: [
      { at: 0, subject: 'burst', expect: taken(4, 1) },
      { at: 0, subject: 'burst', repeat: 99, expect: held(4, 1) },
      { at: 1, subject: 's1', expect: taken(3, 2) },
      { at: 1, subject: 's2', expect: taken(2, 3) },
      { at: 1, subject: 's3', expect: taken(1, 4) },
      { at: 1, subject: 's4', expect: taken(0, 5) },
      { at: 1, subject: 's5', expect: full(9999, 5) },
      { at: 2, subject: 's6', expect: full(9998, 5) },
      { at: 3, subject: 'burst', expect: held(0, 5) },
    ],
  },
  {
    name: "a subject's creation leaves the window at exactly its stamp plus the window; then it is new again",
    limit: 2,
    steps: [
      { at: 0, subject: 'a', expect: taken(1, 1) },
      { at: 5000, subject: 'b', expect: taken(0, 2) },
      { at: 9999, subject: 'a', expect: held(0, 2) },
      { at: 9999, subject: 'c', expect: full(1, 2) },
      // a's entry left: its next ask counts again (its bucket was gone, or this is a new version of it).
      { at: 10_000, subject: 'a', expect: taken(0, 2) },
      { at: 10_000, subject: 'c', expect: full(5000, 2) },
      { at: 15_000, subject: 'c', expect: taken(0, 2) },
    ],
  },
  {
    name: 'a dry run takes nothing: it answers taken, held or full as a real call would',
    limit: 1,
    steps: [
      { at: 0, subject: 'a', dryRun: true, expect: taken(0, 0) },
      { at: 0, subject: 'a', dryRun: true, expect: taken(0, 0) },
      { at: 1000, subject: 'a', expect: taken(0, 1) },
      { at: 1000, subject: 'a', dryRun: true, expect: held(0, 1) },
      { at: 2000, subject: 'b', dryRun: true, expect: full(9000, 1) },
      { at: 2000, subject: 'b', expect: full(9000, 1) },
    ],
  },
  {
    name: 'Redis time stepping back never reopens the window: stamps stay at the newest',
    limit: 2,
    steps: [
      { at: 5000, subject: 'a', expect: taken(1, 1) },
      // 3 s earlier by the clock: stamped at 5,000 ms, like a.
      { at: 2000, subject: 'b', expect: taken(0, 2) },
      { at: 2000, subject: 'c', expect: full(10_000, 2) },
      { at: 14_999, subject: 'c', expect: full(1, 2) },
      { at: 15_000, subject: 'c', expect: taken(1, 1) },
    ],
  },
];

/** Key of a case's creation log (the cap's own slot) and member of a subject (its bucket key). */
export function caseLogKey(prefix: string): string {
  return `rl:new-subjects:{#${prefix}}`;
}

/** One step as the script sees it, at its virtual instant. */
export interface PreparedCreationStep {
  step: CreationCaseStep;
  request: CreationRequest;
  nowMicros: number;
}

/** Build a case's requests, with the log and members under `prefix`. */
export function prepareCreationCase(prefix: string, c: CreationCase): PreparedCreationStep[] {
  const out: PreparedCreationStep[] = [];
  for (const step of c.steps) {
    const request: CreationRequest = {
      key: caseLogKey(prefix),
      member: `rl:v1:{${prefix}-${step.subject}}:p`,
      limit: c.limit ?? 3,
      windowMs: CASE_WINDOW_MS,
      ttlMs: CASE_WINDOW_MS,
      ...(step.dryRun === true ? { dryRun: true } : {}),
    };
    for (let i = 0; i < (step.repeat ?? 1); i++)
      out.push({ step, request, nowMicros: CREATION_CASE_EPOCH_MICROS + step.at * 1000 });
  }
  return out;
}
