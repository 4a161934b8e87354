// Untrusted strings are never plain-object keys. A record typed `Record<string, T>` (or any type with a string index
// signature) is a plain object at run time: `record[name]` with `name` = "constructor", "toString" or "__proto__"
// finds Object.prototype's members, `name in record` says yes to them, and `record[name] = v` with "__proto__"
// replaces the object's prototype. Issue 25 found a class lookup answering `Object` for `"class": "constructor"`
// (a check admitted without charge). This rule reports every computed read, write or `in` test of such a type by a
// key typed as an open string; the fix is a Map, or `ownValue` / `hasOwnKey` from core/own-keys.ts.
// test/unit/repo/own-keys-rule.test.ts shows it catches the original lookup.
import ts from 'typescript';

/** The types a value of `type` may have: the members of a union, else itself. */
const members = (type) => (type.isUnion() ? type.types : [type]);

/** True when a key of this type may be any string (a string, a template or an unknown), not literals only. */
function isOpenKey(type) {
  const open =
    ts.TypeFlags.String |
    ts.TypeFlags.TemplateLiteral |
    ts.TypeFlags.StringMapping |
    ts.TypeFlags.Any |
    ts.TypeFlags.Unknown;
  return members(type).some((t) => (t.flags & open) !== 0);
}

/** True when a value of this type may be a plain object indexed by any string (a record, a dictionary). */
function isStringRecord(checker, type) {
  const t = checker.getNonNullableType(type);
  return members(t).some((m) => {
    const apparent = checker.getApparentType(checker.getBaseConstraintOfType(m) ?? m);
    if (checker.isArrayLikeType(apparent)) return false;
    const parts = apparent.isIntersection() ? apparent.types : [apparent];
    return parts.some((p) => checker.getIndexInfoOfType(p, ts.IndexKind.String) !== undefined);
  });
}

const MESSAGE =
  'a key that may be any string, on a plain-object record: "constructor", "__proto__" or "toString" reach ' +
  'Object.prototype. Use a Map, or ownValue/hasOwnKey/setOwn from core/own-keys.ts.';

/** @type {import('eslint').Rule.RuleModule} */
const noUntrustedRecordKey = {
  meta: {
    type: 'problem',
    docs: {
      description: 'Disallow plain-object records indexed by open strings (prototype names reach Object).',
    },
    messages: { recordKey: MESSAGE },
    schema: [],
  },
  create(context) {
    const services = context.sourceCode.parserServices;
    if (services?.program === undefined || services.program === null) return {};
    const checker = services.program.getTypeChecker();
    const typeOf = (node) => checker.getTypeAtLocation(services.esTreeNodeToTSNodeMap.get(node));
    const risky = (record, key) => isOpenKey(typeOf(key)) && isStringRecord(checker, typeOf(record));
    return {
      MemberExpression(node) {
        if (node.computed && risky(node.object, node.property))
          context.report({ node, messageId: 'recordKey' });
      },
      'BinaryExpression[operator="in"]'(node) {
        if (node.left.type !== 'PrivateIdentifier' && risky(node.right, node.left))
          context.report({ node, messageId: 'recordKey' });
      },
    };
  },
};

/**
 * `z.record(…)` outside core/own-keys.ts: zod 4 drops a `__proto__` key of a record in silence; `ownRecord` refuses
 * it with an issue that names it. For `no-restricted-syntax`.
 */
export const zodRecordSelector = {
  selector: "CallExpression[callee.object.name='z'][callee.property.name='record']",
  message: 'parse records with ownRecord (core/own-keys.ts): z.record drops a "__proto__" key in silence',
};

/** The plugin eslint.config.mjs registers as `quotaplane`. */
export const ownKeysPlugin = { rules: { 'no-untrusted-record-key': noUntrustedRecordKey } };

/** Where the rule applies: every source that handles input from HTTP, gRPC, NATS, files or the command line. */
export const OWN_KEY_FILES = [
  'core/**/*.ts',
  'regional-agent/**/*.ts',
  'coordinator/**/*.ts',
  'common/**/*.ts',
  'cli/**/*.ts',
  'simulations/**/*.ts',
  'packages/client/src/**/*.ts',
];
