import { createHmac } from 'node:crypto';

/** Longest normalized subject. */
export const MAX_SUBJECT_LENGTH = 96;
/** Longest raw subject accepted for hashing. */
export const MAX_RAW_SUBJECT_LENGTH = 1024;

/**
 * Characters a plain subject may use. Excludes `{` and `}` (they would break the cluster hash tag), whitespace,
 * control characters and anything needing escaping in logs. Fits tenant ids, `user:42`, `ip:2001:db8::/64`.
 */
const SUBJECT_PATTERN = /^[A-Za-z0-9._:/@+=-]+$/;

/** Prefix of hashed subjects; a plain subject may not start with it, so the two spaces never collide. */
export const HASHED_PREFIX = 'h.';

export interface SubjectOptions {
  /**
   * When set, every subject is replaced by `h.` + base64url(HMAC-SHA256(secret, raw)), so keys, logs and
   * metrics never hold the raw identity. Raw subjects may then be any printable text up to 1024 chars.
   */
  hmacSecret?: string | undefined;
}

export type SubjectResult = { ok: true; subject: string } | { ok: false; reason: string };

/** C0 controls, DEL and C1 controls: never part of an identity, and invisible in logs. */
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
/**
 * A surrogate without its pair. The hash reads the subject as UTF-8, where every lone surrogate becomes U+FFFD:
 * "a\ud800", "a\udc00" and "a\ufffd" would be one subject, one bucket.
 */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * Why no agent accepts `raw` as a subject, whatever its configuration (hashed or plain): empty, longer than
 * MAX_RAW_SUBJECT_LENGTH, control characters, a lone surrogate; undefined when some configuration may. The
 * client refuses such a subject itself when the agent cannot answer (a failure mode decides only what the agent
 * could have).
 */
export function neverASubject(raw: string): string | undefined {
  if (raw.length === 0) return 'subject is empty';
  if (raw.length > MAX_RAW_SUBJECT_LENGTH)
    return `subject is longer than ${MAX_RAW_SUBJECT_LENGTH} characters`;
  if (CONTROL.test(raw)) return 'subject contains control characters';
  if (LONE_SURROGATE.test(raw)) return 'subject is not well-formed Unicode (a lone surrogate)';
  return undefined;
}

/** Validate a subject, or hash it when a secret is configured. Pure: same input, same output. */
export function normalizeSubject(raw: string, options: SubjectOptions = {}): SubjectResult {
  if (raw.length === 0) return { ok: false, reason: 'subject is empty' };
  if (options.hmacSecret !== undefined) {
    const never = neverASubject(raw);
    if (never !== undefined) return { ok: false, reason: never };
    const digest = createHmac('sha256', options.hmacSecret).update(raw, 'utf8').digest('base64url');
    return { ok: true, subject: HASHED_PREFIX + digest };
  }
  if (raw.length > MAX_SUBJECT_LENGTH) {
    return { ok: false, reason: `subject is longer than ${MAX_SUBJECT_LENGTH} characters` };
  }
  if (!SUBJECT_PATTERN.test(raw)) {
    return { ok: false, reason: 'subject may only contain A-Z a-z 0-9 . _ : / @ + = -' };
  }
  if (raw.startsWith(HASHED_PREFIX))
    return { ok: false, reason: `subject may not start with "${HASHED_PREFIX}"` };
  return { ok: true, subject: raw };
}

/**
 * A one-way, short fingerprint of a subject for logs: lets an operator correlate lines, never recover the id.
 * Keyed (HMAC-SHA256): an unkeyed hash of a guessable identity (an e-mail, a tenant id) is reversed by trying
 * candidates. The agent keys it with its HMAC secret (fingerprints then match across agents) or, without one,
 * with a random key of the process.
 */
export function subjectFingerprint(subject: string, key: string | Uint8Array): string {
  return createHmac('sha256', key).update(subject, 'utf8').digest('base64url').slice(0, 12);
}
