/**
 * How Envoy's rate-limit descriptors map to quotaplane checks: an ordered list of rules, the first that matches
 * a descriptor wins. A rule names the domain (or `*`), the descriptor's keys in order (each with a fixed value
 * or any), and templates for the policy and the subject, where `{key}` is that entry's value and `{key:ip}` the
 * client-address subject of an IP value, by the prefixes of the policy checked (core/subjects/ip-subject.ts: an `ip`
 * policy's own; IPv4 whole and IPv6 by its /64 for any other, as forward-auth does). A descriptor no rule
 * matches is not limited (Envoy's own rate-limit service does the same), and counted.
 *
 * Without a rules file (`QP_RLS_RULES_FILE`) one rule serves every domain: descriptors `[("policy", P),
 * ("subject", S)]`, which Envoy builds with two actions, `generic_key { descriptor_key: policy, descriptor_value:
 * P }` and `request_headers { header_name: …, descriptor_key: subject }`.
 */
import { z } from 'zod';
import { MAX_RLS_ENTRIES, MAX_RLS_TEXT, type RlsDescriptor } from '../../core/wire/rls.js';
import {
  clientAddressSubject,
  DEFAULT_IP_PREFIXES,
  type IpPrefixes,
} from '../../core/subjects/ip-subject.js';

const Text = z.string().min(1).max(MAX_RLS_TEXT);
const PLACEHOLDER = /\{([^{}:]+)(?::(ip))?\}/g;

/** A policy or subject template: text with `{key}` or `{key:ip}` placeholders. */
const Template = z
  .string()
  .min(1)
  .max(MAX_RLS_TEXT)
  .refine((t) => !/[{}]/.test(t.replace(PLACEHOLDER, '')), 'placeholders are {key} or {key:ip}');

export const RlsRule = z
  .strictObject({
    /** The request's domain, or `*` for any. */
    domain: Text.default('*'),
    /** The descriptor's entries, in order: a key, and a value when only that value matches. */
    entries: z
      .array(z.strictObject({ key: Text, value: Text.optional() }))
      .min(1)
      .max(MAX_RLS_ENTRIES),
    /** The policy checked, e.g. `reports` or `{policy}`. */
    policy: Template,
    /** The subject charged, e.g. `tenant:{tenant}` or `{remote_address:ip}`. */
    subject: Template,
  })
  .superRefine((rule, ctx) => {
    const keys = new Set(rule.entries.map((e) => e.key));
    for (const field of ['policy', 'subject'] as const) {
      for (const [, key] of rule[field].matchAll(PLACEHOLDER)) {
        if (!keys.has(key!)) {
          ctx.addIssue({
            code: 'custom',
            path: [field],
            message: `{${key}} is not a key of this rule's entries`,
          });
        }
      }
    }
  });
export type RlsRule = z.output<typeof RlsRule>;

/** The rules file: `{ "rules": [ … ] }`. */
export const RlsRules = z.strictObject({ rules: z.array(RlsRule).min(1).max(1000) });
export type RlsRules = z.output<typeof RlsRules>;

/** The rule in force without a rules file. */
export const DEFAULT_RLS_RULES: RlsRules = RlsRules.parse({
  rules: [
    {
      domain: '*',
      entries: [{ key: 'policy' }, { key: 'subject' }],
      policy: '{policy}',
      subject: '{subject}',
    },
  ],
});

/** A descriptor's check, or why the descriptor cannot be one. */
export type MappedDescriptor =
  | { kind: 'check'; policy: string; subject: string }
  | { kind: 'unmatched' }
  | { kind: 'invalid'; message: string };

/** Maps descriptors of a domain to checks by the first rule that matches each. */
export class DescriptorRules {
  readonly #rules: readonly RlsRule[];

  constructor(rules: RlsRules) {
    this.#rules = rules.rules;
  }

  /** `prefixesOf(policy)`: what `{key:ip}` buckets an address by in a check of that policy. */
  map(
    domain: string,
    descriptor: RlsDescriptor,
    prefixesOf: (policy: string) => IpPrefixes = () => DEFAULT_IP_PREFIXES,
  ): MappedDescriptor {
    const entries = descriptor.entries;
    const rule = this.#rules.find(
      (r) =>
        (r.domain === '*' || r.domain === domain) &&
        r.entries.length === entries.length &&
        r.entries.every(
          (e, i) => e.key === entries[i]!.key && (e.value === undefined || e.value === entries[i]!.value),
        ),
    );
    if (rule === undefined) return { kind: 'unmatched' };
    const values = new Map(entries.map((e) => [e.key, e.value]));
    let invalid: string | undefined;
    const render = (template: string, prefixes: IpPrefixes) =>
      template.replace(PLACEHOLDER, (_all, key: string, filter: string | undefined) => {
        const value = values.get(key)!;
        if (filter !== 'ip') return value;
        const subject = clientAddressSubject(value, prefixes);
        if (subject === undefined) invalid ??= `${key} ${JSON.stringify(value)} is not an IP address`;
        return subject ?? '';
      });
    const policy = render(rule.policy, DEFAULT_IP_PREFIXES);
    const subject = render(rule.subject, prefixesOf(policy));
    if (invalid !== undefined) return { kind: 'invalid', message: invalid };
    return { kind: 'check', policy, subject };
  }
}
