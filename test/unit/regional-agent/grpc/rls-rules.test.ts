import { describe, expect, it } from 'vitest';
import type { ConfigError } from '../../../../regional-agent/config.js';
import { loadConfig } from '../../../../regional-agent/config.js';
import {
  DEFAULT_RLS_RULES,
  DescriptorRules,
  RlsRules,
} from '../../../../regional-agent/grpc/descriptor-rules.js';
import { perUnit } from '../../../../regional-agent/grpc/rls-response.js';
import { docBlock } from '../../../helpers/doc-blocks.js';

const entries = (...pairs: [string, string][]) => ({
  entries: pairs.map(([key, value]) => ({ key, value })),
});

describe('descriptor rules', () => {
  const rules = new DescriptorRules(
    RlsRules.parse({
      rules: [
        {
          domain: 'edge',
          entries: [{ key: 'generic_key', value: 'exports' }, { key: 'tenant' }],
          policy: 'exports',
          subject: 't:{tenant}',
        },
        { domain: 'edge', entries: [{ key: 'tenant' }], policy: 'reads', subject: 't:{tenant}' },
        { entries: [{ key: 'remote_address' }], policy: 'anon', subject: '{remote_address:ip}' },
      ],
    }),
  );

  it('the first rule whose domain, keys (in order) and fixed values match wins', () => {
    expect(rules.map('edge', entries(['generic_key', 'exports'], ['tenant', 'acme']))).toEqual({
      kind: 'check',
      policy: 'exports',
      subject: 't:acme',
    });
    expect(rules.map('edge', entries(['tenant', 'acme']))).toMatchObject({ policy: 'reads' });
    // Another fixed value, another order, another domain, another length: no match.
    expect(rules.map('edge', entries(['generic_key', 'imports'], ['tenant', 'acme'])).kind).toBe('unmatched');
    expect(rules.map('edge', entries(['tenant', 'acme'], ['generic_key', 'exports'])).kind).toBe('unmatched');
    expect(rules.map('other', entries(['tenant', 'acme'])).kind).toBe('unmatched');
    expect(rules.map('edge', entries(['tenant', 'a'], ['x', 'y'], ['z', 'w'])).kind).toBe('unmatched');
  });

  it('{key:ip} is the client-address subject; a value that is no address is invalid', () => {
    expect(rules.map('any', entries(['remote_address', '192.0.2.7']))).toMatchObject({
      subject: 'ip:192.0.2.7',
    });
    expect(rules.map('any', entries(['remote_address', '2001:db8:1:2:3:4:5:6']))).toMatchObject({
      subject: 'ip:2001:db8:1:2::/64',
    });
    expect(rules.map('any', entries(['remote_address', 'nope']))).toEqual({
      kind: 'invalid',
      message: 'remote_address "nope" is not an IP address',
    });
  });

  it('{key:ip} buckets the address by the prefixes of the policy checked', () => {
    const prefixesOf = (policy: string) =>
      policy === 'anon' ? { ipv4Prefix: 24, ipv6Prefix: 48 } : { ipv4Prefix: 32, ipv6Prefix: 64 };
    expect(rules.map('any', entries(['remote_address', '192.0.2.7']), prefixesOf)).toMatchObject({
      subject: 'ip:192.0.2.0/24',
    });
    expect(rules.map('any', entries(['remote_address', '2001:db8:1:2:3:4:5:6']), prefixesOf)).toMatchObject({
      subject: 'ip:2001:db8:1::/48',
    });
  });

  it('refuses templates naming a key the rule does not match, or broken placeholders', () => {
    const bad = RlsRules.safeParse({
      rules: [{ entries: [{ key: 'tenant' }], policy: '{plan}', subject: 'x{tenant' }],
    });
    expect(bad.success).toBe(false);
    expect(bad.error!.issues.map((i) => [i.path.join('.'), i.message])).toEqual([
      ['rules.0.subject', 'placeholders are {key} or {key:ip}'],
      ['rules.0.policy', "{plan} is not a key of this rule's entries"],
    ]);
  });

  it('the rules docs/proxies.md shows are valid and do what it says', () => {
    const documented = new DescriptorRules(RlsRules.parse(JSON.parse(docBlock('proxies.md', 'rls-rules'))));
    expect(documented.map('edge', entries(['generic_key', 'reports'], ['tenant', 'acme']))).toEqual({
      kind: 'check',
      policy: 'reports',
      subject: 'tenant:acme',
    });
    expect(documented.map('edge', entries(['remote_address', '2001:db8::1']))).toMatchObject({
      policy: 'anonymous',
      subject: 'ip:2001:db8:0:0::/64',
    });
    expect(documented.map('mesh', entries(['policy', 'demo'], ['subject', 's']))).toMatchObject({
      policy: 'demo',
    });
  });

  it('without a rules file, ("policy", P), ("subject", S) in any domain is policy P for subject S', () => {
    const d = new DescriptorRules(DEFAULT_RLS_RULES);
    expect(d.map('whatever', entries(['policy', 'demo'], ['subject', 'tenant-1']))).toEqual({
      kind: 'check',
      policy: 'demo',
      subject: 'tenant-1',
    });
  });

  it('are read from QP_RLS_RULES_FILE once at start, every problem listed with its path', () => {
    const base = { QP_REGION: 'us', QP_REDIS_URL: 'redis://127.0.0.1:6379', QP_POLICIES_FILE: 'p.json' };
    const files: Record<string, string> = {
      'good.json': JSON.stringify({ rules: [{ entries: [{ key: 'k' }], policy: 'p', subject: '{k}' }] }),
      'bad.json': JSON.stringify({ rules: [{ entries: [], policy: 'p', subject: 's' }] }),
    };
    const read = (path: string) => files[path] ?? '{';
    const good = loadConfig({ ...base, QP_RLS_RULES_FILE: 'good.json', QP_GRPC_PORT: '0' }, read);
    expect(good.rlsRules?.rules[0]).toMatchObject({ domain: '*', policy: 'p' });
    expect(good.grpcPort).toBe(0);
    const problems = (env: Record<string, string>) => {
      try {
        loadConfig({ ...base, ...env }, read);
      } catch (error) {
        return (error as ConfigError).problems;
      }
      return [];
    };
    expect(problems({ QP_RLS_RULES_FILE: 'bad.json' })).toEqual([
      'QP_RLS_RULES (rlsRules) rules.0.entries: Too small: expected array to have >=1 items',
    ]);
    expect(problems({ QP_RLS_RULES_FILE: 'missing.json' })[0]).toMatch(/^QP_RLS_RULES_FILE missing.json: /);
  });
});

describe('a rate as requests per unit', () => {
  it('takes the smallest unit where it is whole, else where flooring loses under 1 %', () => {
    expect(perUnit(2)).toEqual({ requests_per_unit: 2, unit: 'SECOND' });
    expect(perUnit(1.5)).toEqual({ requests_per_unit: 90, unit: 'MINUTE' });
    expect(perUnit(0.05)).toEqual({ requests_per_unit: 3, unit: 'MINUTE' });
    expect(perUnit(1 / 3)).toEqual({ requests_per_unit: 20, unit: 'MINUTE' });
    expect(perUnit(0.0277)).toEqual({ requests_per_unit: 2393, unit: 'DAY' });
    // 288 × 0.6 per second in doubles: 172.8 exactly per second is 10368 per minute.
    expect(perUnit(172.79999999999998)).toEqual({ requests_per_unit: 10368, unit: 'MINUTE' });
  });
});
