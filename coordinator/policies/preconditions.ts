/**
 * Conditional requests (RFC 9110 §13): a policy's ETag is its KV revision, quoted. `If-Match` uses strong
 * comparison, `If-None-Match` weak comparison; both accept `*` or a list of entity tags.
 */

/** One entity tag of a request header. */
export interface EntityTag {
  readonly weak: boolean;
  /** The text between the quotes. */
  readonly opaque: string;
}

/** `*` (any current representation) or a list of tags. */
export type TagCondition = '*' | readonly EntityTag[];

/** The preconditions of one request; absent fields impose nothing. */
export interface Precondition {
  readonly ifMatch?: TagCondition | undefined;
  readonly ifNoneMatch?: TagCondition | undefined;
}

/** The ETag of a revision. */
export function etagOf(revision: number): string {
  return `"${revision}"`;
}

const TAG = /^(W\/)?"([\x21\x23-\x7e]*)"$/;

/** Parse an `If-Match` / `If-None-Match` value; throws `SyntaxError` with a readable reason. */
export function parseTagCondition(value: string): TagCondition {
  const trimmed = value.trim();
  if (trimmed === '*') return '*';
  const tags: EntityTag[] = [];
  for (const part of trimmed.split(',')) {
    const m = TAG.exec(part.trim());
    if (m === null) {
      throw new SyntaxError(
        `expected * or quoted entity tags such as "42", got ${JSON.stringify(part.trim().slice(0, 40))}`,
      );
    }
    tags.push({ weak: m[1] !== undefined, opaque: m[2] ?? '' });
  }
  return tags;
}

/**
 * Why the request's preconditions fail against the current revision (`undefined` when there is no current
 * representation), or `undefined` when they hold.
 */
export function failedPrecondition(p: Precondition, current: number | undefined): string | undefined {
  if (p.ifMatch !== undefined) {
    const holds =
      current !== undefined &&
      (p.ifMatch === '*' || p.ifMatch.some((t) => !t.weak && t.opaque === String(current)));
    if (!holds) {
      return current === undefined
        ? 'If-Match: the policy does not exist'
        : `If-Match: the policy's current ETag is ${etagOf(current)}`;
    }
  }
  if (p.ifNoneMatch !== undefined && current !== undefined) {
    const matches = p.ifNoneMatch === '*' || p.ifNoneMatch.some((t) => t.opaque === String(current));
    if (matches) {
      return p.ifNoneMatch === '*'
        ? 'If-None-Match: * but the policy already exists'
        : `If-None-Match: the policy's current ETag is ${etagOf(current)}`;
    }
  }
  return undefined;
}
