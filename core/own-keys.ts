/**
 * Names callers send (subjects, classes, policies, regions, descriptor keys, header names) are never looked up as
 * plain-object keys: on a `{}` record, "constructor", "toString" or "__proto__" find Object.prototype's members,
 * `key in record` says yes to them, and `record["__proto__"] = v` replaces the record's prototype. Records that
 * must stay plain objects (they are JSON on the wire: a policy's `classes` and `subjects`, shares by region) are
 * read and written through these helpers; everything else is a Map. `npm run lint` reports any other lookup of a
 * record by an open string (eslint.own-keys.mjs).
 */
import { z } from 'zod';

/** The value `record` holds under `key` as its own property; undefined for anything its prototype has. */
export function ownValue<T>(record: Readonly<Record<string, T>> | undefined, key: string): T | undefined {
  if (record === undefined || !Object.hasOwn(record, key)) return undefined;
  // eslint-disable-next-line quotaplane/no-untrusted-record-key -- an own property, checked on the line above
  return record[key];
}

/** True when `record` has `key` as its own property (what `key in record` means to say). */
export function hasOwnKey(record: object | undefined, key: string): boolean {
  return record !== undefined && Object.hasOwn(record, key);
}

/**
 * Set `key` on `record` as an own, enumerable property, "__proto__" included: a defined property, never the
 * prototype setter an assignment would call.
 */
export function setOwn<T>(record: Record<string, T>, key: string, value: NoInfer<T>): void {
  Object.defineProperty(record, key, { value, writable: true, enumerable: true, configurable: true });
}

/** A record built from entries as own properties only (Object.fromEntries, without the prototype setter). */
export function ownRecordOf<T>(entries: Iterable<readonly [string, T]>): Record<string, T> {
  const out: Record<string, T> = {};
  for (const [key, value] of entries) setOwn(out, key, value);
  return out;
}

/**
 * `z.record(key, value)` that refuses a `__proto__` key with an issue naming it. zod 4 drops such a key in
 * silence (it would replace the parsed object's prototype), so an operator's `"subjects": {"__proto__": …}`
 * would vanish without a word. How this codebase parses a record it receives (lint refuses `z.record` elsewhere);
 * a record in a reply schema is `replyRecord`.
 */
export function ownRecord<K extends z.core.$ZodRecordKey, V extends z.core.SomeType>(key: K, value: V) {
  // eslint-disable-next-line no-restricted-syntax -- the one z.record, guarded below
  const record = z.record(key, value);
  return z.preprocess<unknown, typeof record, z.input<typeof record>>((input, ctx) => {
    if (typeof input === 'object' && input !== null && Object.hasOwn(input, '__proto__')) {
      ctx.issues.push({
        code: 'custom',
        path: ['__proto__'],
        message: '"__proto__" cannot be a key here',
        input,
      });
    }
    return input;
  }, record);
}

/**
 * `z.record(key, value)` for a record in a reply this service writes and a serializer encodes (zod cannot encode
 * through `ownRecord`'s guard). Whoever parses such a reply back parses what our own service wrote; zod still
 * drops a `__proto__` key there, never sets a prototype.
 */
export function replyRecord<K extends z.core.$ZodRecordKey, V extends z.core.SomeType>(key: K, value: V) {
  // eslint-disable-next-line no-restricted-syntax -- a reply's record: see above
  return z.record(key, value);
}
