import { describe, expect, it } from 'vitest';
import {
  clientAddressSubject,
  DEFAULT_IP_PREFIXES,
  ipPrefixesOf,
  ipSubject,
  type IpPrefixes,
} from '../../../../core/subjects/ip-subject.js';
import { parsePolicy, Policy, PolicySpec } from '../../../../core/policy/policy.js';
import { normalizeSubject } from '../../../../core/subjects/subject.js';

const v6 = (ipv6Prefix: number): IpPrefixes => ({ ipv4Prefix: 32, ipv6Prefix });
const v4 = (ipv4Prefix: number): IpPrefixes => ({ ipv4Prefix, ipv6Prefix: 64 });
const subjectOf = (text: string, prefixes: IpPrefixes = DEFAULT_IP_PREFIXES) => {
  const r = ipSubject(text, prefixes);
  if (!r.ok) throw new Error(r.reason);
  return r.subject;
};

describe('IP subjects: normalization', () => {
  it('keeps the subjects forward-auth made before prefixes were configurable (IPv4 whole, IPv6 by /64)', () => {
    expect(clientAddressSubject('203.0.113.9')).toBe('ip:203.0.113.9');
    expect(clientAddressSubject('::ffff:203.0.113.9')).toBe('ip:203.0.113.9');
    expect(clientAddressSubject('2001:db8:abcd:12::1')).toBe('ip:2001:db8:abcd:12::/64');
    expect(clientAddressSubject('2001:0db8:abcd:0012:ffff:ffff:ffff:ffff')).toBe('ip:2001:db8:abcd:12::/64');
    expect(clientAddressSubject('2001:db8::1')).toBe('ip:2001:db8:0:0::/64');
    expect(clientAddressSubject('not an address')).toBeUndefined();
  });

  it.each([
    ['203.0.113.9', 32, 'ip:203.0.113.9'],
    ['203.0.113.9', 24, 'ip:203.0.113.0/24'],
    ['203.0.113.200', 25, 'ip:203.0.113.128/25'],
    ['203.0.113.9', 16, 'ip:203.0.0.0/16'],
    ['203.0.113.9', 8, 'ip:203.0.0.0/8'],
    ['0.0.0.0', 32, 'ip:0.0.0.0'],
    ['255.255.255.255', 20, 'ip:255.255.240.0/20'],
  ])('IPv4 %s by /%i is %s', (address, prefix, subject) => {
    expect(subjectOf(address, v4(prefix))).toBe(subject);
  });

  it('IPv4-mapped IPv6 is IPv4, bucketed by the IPv4 prefix', () => {
    expect(subjectOf('::ffff:203.0.113.9', v4(24))).toBe('ip:203.0.113.0/24');
    expect(subjectOf('::ffff:cb00:7109', v4(32))).toBe('ip:203.0.113.9');
    expect(subjectOf('0:0:0:0:0:ffff:203.0.113.9', v4(32))).toBe('ip:203.0.113.9');
  });

  it.each([
    ['2001:db8:abcd:1234:5678::1', 48, 'ip:2001:db8:abcd::/48'],
    ['2001:db8:abcd:12ff:5678::1', 56, 'ip:2001:db8:abcd:1200::/56'],
    ['2001:db8:abcd:12ff:5678::1', 64, 'ip:2001:db8:abcd:12ff::/64'],
    ['2001:DB8:ABCD:12FF::1', 64, 'ip:2001:db8:abcd:12ff::/64'],
    ['2001:db8:abcd:12ff:5678::1', 60, 'ip:2001:db8:abcd:12f0::/60'],
    ['2001:db8:abcd:12ff:5678::1', 16, 'ip:2001::/16'],
    ['2001:db8:abcd:12ff:5678:9:a:b', 120, 'ip:2001:db8:abcd:12ff:5678:9:a:0/120'],
    ['2001:db8:abcd:12ff:5678:9:a:b', 112, 'ip:2001:db8:abcd:12ff:5678:9:a::/112'],
    ['2001:db8::b', 128, 'ip:2001:db8:0:0:0:0:0:b'],
  ])('IPv6 %s by /%i is %s', (address, prefix, subject) => {
    expect(subjectOf(address, v6(prefix))).toBe(subject);
  });

  it('every address of one prefix is one subject; the next prefix is another', () => {
    const a = subjectOf('2001:db8:1:100::1', v6(56));
    expect(subjectOf('2001:db8:1:1ff:ffff:ffff:ffff:ffff', v6(56))).toBe(a);
    expect(subjectOf('2001:db8:1:200::1', v6(56))).not.toBe(a);
  });

  it('drops an IPv6 zone id: it names the sender’s interface, not a client', () => {
    expect(subjectOf('fe80::1%eth0', v6(64))).toBe('ip:fe80:0:0:0::/64');
    expect(subjectOf('fe80::1%eth0', v6(128))).toBe(subjectOf('fe80::1', v6(128)));
  });

  it('accepts ip: + an address, and ip: + a network at least as long as the prefix: canonical text is a fixed point', () => {
    expect(subjectOf('ip:203.0.113.9', v4(24))).toBe('ip:203.0.113.0/24');
    expect(subjectOf('ip:203.0.113.0/24', v4(24))).toBe('ip:203.0.113.0/24');
    expect(subjectOf('ip:203.0.113.77/28', v4(24))).toBe('ip:203.0.113.0/24');
    expect(subjectOf('ip:2001:db8:abcd:12::/64', v6(48))).toBe('ip:2001:db8:abcd::/48');
    for (const [address, prefixes] of [
      ['198.51.100.7', v4(8)],
      ['198.51.100.7', v4(32)],
      ['2001:db8:abcd:12ff:5678:9:a:b', v6(16)],
      ['2001:db8:abcd:12ff:5678:9:a:b', v6(56)],
      ['2001:db8:abcd:12ff:5678:9:a:b', v6(100)],
      ['2001:db8:abcd:12ff:5678:9:a:b', v6(120)],
      ['2001:db8:abcd:12ff:5678:9:a:b', v6(128)],
    ] as const) {
      const once = subjectOf(address, prefixes);
      expect(subjectOf(once, prefixes)).toBe(once);
      // Canonical text is a valid plain subject too (it becomes key text, or is hashed like any other).
      expect(normalizeSubject(once)).toEqual({ ok: true, subject: once });
    }
  });

  it.each([
    ['user:42', 'is not an IP address'],
    ['', 'is not an IP address'],
    ['203.0.113', 'is not an IP address'],
    ['127.1', 'is not an IP address'],
    ['0x7f.0.0.1', 'is not an IP address'],
    ['010.0.0.1', 'is not an IP address'],
    ['256.0.0.1', 'is not an IP address'],
    ['2001:db8::1::2', 'is not an IP address'],
    ['2001:db8::1%', 'has no valid zone id'],
    ['2001:db8::1%eth 0', 'has no valid zone id'],
    ['203.0.113.9%eth0', 'is not an IP address'],
    ['ip:', 'is not an IP address'],
    ['203.0.113.9/33', 'an IPv4 prefix is at most /32'],
    ['2001:db8::/129', 'an IPv6 prefix is at most /128'],
    ['203.0.113.9/', 'has no valid prefix length'],
    ['203.0.113.9/x', 'has no valid prefix length'],
    ['ip:203.0.113.0/16', 'is a /16, wider than the /24 this policy counts IPv4 clients by'],
    ['ip:2001:db8::/32', 'is a /32, wider than the /64 this policy counts IPv6 clients by'],
    ['::ffff:203.0.113.0/64', 'wider than an IPv4-mapped address can be'],
    ['1'.repeat(97), 'subject is too long for an IP address'],
  ])('refuses %j', (text, reason) => {
    const r = ipSubject(text, { ipv4Prefix: 24, ipv6Prefix: 64 });
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.reason).toContain(reason);
  });

  it('a client address is an address: no ip: tag, no length', () => {
    expect(clientAddressSubject('ip:203.0.113.9')).toBeUndefined();
    expect(clientAddressSubject('203.0.113.9/32')).toBeUndefined();
    expect(clientAddressSubject('203.0.113.9', v4(24))).toBe('ip:203.0.113.0/24');
  });

  it('a policy’s prefixes: its own when its subjects are IP addresses, the defaults otherwise', () => {
    expect(ipPrefixesOf(undefined)).toEqual(DEFAULT_IP_PREFIXES);
    expect(ipPrefixesOf({ ipv6Prefix: 48 })).toEqual(DEFAULT_IP_PREFIXES);
    expect(ipPrefixesOf({ subjectKind: 'ip' })).toEqual({ ipv4Prefix: 32, ipv6Prefix: 64 });
    expect(ipPrefixesOf({ subjectKind: 'ip', ipv4Prefix: 24, ipv6Prefix: 56 })).toEqual({
      ipv4Prefix: 24,
      ipv6Prefix: 56,
    });
  });
});

describe('subjectKind ip: the schema', () => {
  const base = { name: 'login-prefix', capacity: 20, refillPerSecond: 0.1 };
  const problems = (input: unknown) => {
    const r = Policy.safeParse(input);
    return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
  };

  it('fills the prefixes of an ip policy (IPv4 /32, IPv6 /64) and keeps those it is given', () => {
    expect(parsePolicy({ ...base, subjectKind: 'ip' })).toMatchObject({
      subjectKind: 'ip',
      ipv4Prefix: 32,
      ipv6Prefix: 64,
    });
    expect(parsePolicy({ ...base, subjectKind: 'ip', ipv4Prefix: 24, ipv6Prefix: 48 })).toMatchObject({
      ipv4Prefix: 24,
      ipv6Prefix: 48,
    });
    // Any other policy gains no field: its stored form and its answers stay what they were.
    const plain = parsePolicy(base);
    expect(Object.keys(plain)).not.toEqual(expect.arrayContaining(['subjectKind']));
    expect('ipv4Prefix' in plain || 'ipv6Prefix' in plain).toBe(false);
  });

  it('goes with every kind, and with the subject-creation cap', () => {
    for (const spec of [
      { kind: 'sliding_log', capacity: 5, windowSeconds: 600 },
      { kind: 'concurrency', capacity: 2, leaseSeconds: 30 },
      { kind: 'daily', capacity: 1000 },
      { capacity: 5, refillPerSecond: 0.1, newSubjects: { perMinute: 50, flood: 'shared' } },
    ]) {
      expect(
        problems({ name: 'p', ...spec, subjectKind: 'ip', ipv6Prefix: 56 }),
        JSON.stringify(spec),
      ).toEqual([]);
    }
  });

  it.each([
    [{ subjectKind: 'ip', ipv4Prefix: 7 }, 'ipv4Prefix: ipv4Prefix must be ≥ 8'],
    [{ subjectKind: 'ip', ipv4Prefix: 33 }, 'ipv4Prefix: ipv4Prefix must be ≤ 32'],
    [{ subjectKind: 'ip', ipv6Prefix: 15 }, 'ipv6Prefix: ipv6Prefix must be ≥ 16'],
    [{ subjectKind: 'ip', ipv6Prefix: 129 }, 'ipv6Prefix: ipv6Prefix must be ≤ 128'],
    [{ subjectKind: 'ip', ipv6Prefix: 56.5 }, 'ipv6Prefix: ipv6Prefix must be a whole number of bits'],
    [{ ipv6Prefix: 48 }, 'ipv6Prefix: ipv6Prefix is only for subjectKind ip'],
    [{ ipv4Prefix: 24 }, 'ipv4Prefix: ipv4Prefix is only for subjectKind ip'],
    [{ subjectKind: 'ipv6' }, 'subjectKind: Invalid input: expected "ip"'],
  ])('refuses %j', (patch, message) => {
    expect(problems({ ...base, ...patch })).toEqual([message]);
  });

  it('names subjects of an ip policy by their canonical prefix, and lists every other name', () => {
    const classes = { partner: { capacity: 200, refillPerSecond: 1 } };
    const ok = parsePolicy({
      ...base,
      subjectKind: 'ip',
      ipv4Prefix: 24,
      classes,
      subjects: { 'ip:198.51.100.0/24': 'partner', 'ip:2001:db8:7:1::/64': 'partner' },
    });
    expect(ok.subjects).toEqual({ 'ip:198.51.100.0/24': 'partner', 'ip:2001:db8:7:1::/64': 'partner' });
    expect(
      problems({
        ...base,
        subjectKind: 'ip',
        ipv4Prefix: 24,
        classes,
        subjects: { '198.51.100.7': 'partner', 'tenant-1': 'partner', 'ip:198.51.0.0/16': 'partner' },
      }),
    ).toEqual([
      'subjects.198.51.100.7: an ip policy names a subject by its prefix: write ip:198.51.100.0/24',
      'subjects.tenant-1: "tenant-1" is not an IP address',
      'subjects.ip:198.51.0.0/16: "ip:198.51.0.0/16" is a /16, wider than the /24 this policy counts IPv4 clients by',
    ]);
  });

  it('the operator body keeps the prefixes it was given and nothing more (the store re-derives the rest)', () => {
    expect(PolicySpec.in.parse({ capacity: 20, refillPerSecond: 0.1, subjectKind: 'ip' })).not.toHaveProperty(
      'ipv6Prefix',
    );
  });
});
