/**
 * Anonymous identity: the subject of a client known only by its address. One customer's network usually holds
 * a whole IPv6 /64 (often a /56 or /48), so per-address buckets would let it rotate addresses forever: an address
 * is bucketed by its network prefix, IPv4 by `ipv4Prefix` bits (default 32, the address itself) and IPv6 by
 * `ipv6Prefix` bits (default 64). IPv4-mapped IPv6 (`::ffff:203.0.113.9`) counts as IPv4; an IPv6 zone id
 * (`fe80::1%eth0`) names an interface of the sender, not a client, and is dropped.
 *
 * The canonical text, which is what keys, shares and logs see (hashed like any subject under an HMAC secret):
 * - IPv4: `ip:203.0.113.9` for a /32, else the network and its length, `ip:203.0.113.0/24`;
 * - IPv6: the groups the prefix covers in lower-case hex without leading zeros, then `::/len`
 *   (`ip:2001:db8:abcd:12::/64`, `ip:2001:db8:ab::/48`); all eight groups for a /113 to /127 (`…:7/120`), and
 *   no length for a /128.
 * Parsing accepts a bare address, `ip:` + an address, or `ip:` + a network at least as long as the prefix (so a
 * canonical text is its own normal form). IPv4 is dotted-quad decimal only: `127.1` and `0x7f.0.0.1`, which
 * some parsers take for 127.0.0.1, are refused rather than guessed at. Pure: no I/O.
 */
import ipaddr from 'ipaddr.js';
import type { SubjectResult } from './subject.js';

/** The prefix lengths an address is bucketed by. */
export interface IpPrefixes {
  ipv4Prefix: number;
  ipv6Prefix: number;
}

/** IPv4 whole, IPv6 by its /64: the client-address subject of every policy that does not set its own. */
export const DEFAULT_IP_PREFIXES: Readonly<IpPrefixes> = Object.freeze({ ipv4Prefix: 32, ipv6Prefix: 64 });

/** Prefix lengths a policy may set: an IPv4 /8 to /32, an IPv6 /16 to /128. */
export const IPV4_PREFIX_BOUNDS = Object.freeze({ min: 8, max: 32 });
export const IPV6_PREFIX_BOUNDS = Object.freeze({ min: 16, max: 128 });

/** What every IP subject starts with. */
export const IP_SUBJECT_TAG = 'ip:';

/** Longest text parsed: a full IPv6 address with an embedded IPv4, a zone id and a length fit well within. */
const MAX_IP_TEXT = 96;

/** The prefixes of a policy: its own when its subjects are IP addresses, else the defaults. */
export function ipPrefixesOf(
  policy:
    | { subjectKind?: string | undefined; ipv4Prefix?: number | undefined; ipv6Prefix?: number | undefined }
    | undefined,
): IpPrefixes {
  if (policy?.subjectKind !== 'ip') return DEFAULT_IP_PREFIXES;
  return {
    ipv4Prefix: policy.ipv4Prefix ?? DEFAULT_IP_PREFIXES.ipv4Prefix,
    ipv6Prefix: policy.ipv6Prefix ?? DEFAULT_IP_PREFIXES.ipv6Prefix,
  };
}

/** An address (IPv4 octets or IPv6 16-bit groups) and the length it was given with, if any. */
interface Parsed {
  family: 4 | 6;
  parts: number[];
  length: number | undefined;
}

function parse(text: string): Parsed | string {
  const slash = text.indexOf('/');
  let address = slash < 0 ? text : text.slice(0, slash);
  let length: number | undefined;
  if (slash >= 0) {
    const digits = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(digits)) return `${JSON.stringify(text)} has no valid prefix length`;
    length = Number(digits);
  }
  if (ipaddr.IPv4.isValidFourPartDecimal(address)) {
    if (length !== undefined && length > 32) return `${JSON.stringify(text)}: an IPv4 prefix is at most /32`;
    return { family: 4, parts: ipaddr.IPv4.parse(address).octets.slice(), length };
  }
  const zone = address.indexOf('%');
  if (zone >= 0) {
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(address.slice(zone + 1))) {
      return `${JSON.stringify(text)} has no valid zone id`;
    }
    address = address.slice(0, zone);
  }
  if (!address.includes(':') || !ipaddr.IPv6.isValid(address)) {
    return `${JSON.stringify(text)} is not an IP address`;
  }
  if (length !== undefined && length > 128) return `${JSON.stringify(text)}: an IPv6 prefix is at most /128`;
  const ip = ipaddr.IPv6.parse(address);
  if (ip.isIPv4MappedAddress()) {
    if (length !== undefined && length < 96) {
      return `${JSON.stringify(text)} is wider than an IPv4-mapped address can be (/96)`;
    }
    return {
      family: 4,
      parts: ip.toIPv4Address().octets.slice(),
      length: length === undefined ? undefined : length - 96,
    };
  }
  return { family: 6, parts: ip.parts.slice(), length };
}

/** `parts` (of `bits` bits each) with every bit past the first `prefix` cleared. */
function masked(parts: readonly number[], bits: number, prefix: number): number[] {
  return parts.map((part, i) => {
    const keep = Math.min(bits, Math.max(0, prefix - i * bits));
    return keep === 0 ? 0 : part & (((1 << keep) - 1) << (bits - keep));
  });
}

function canonical(family: 4 | 6, parts: readonly number[], prefix: number): string {
  if (family === 4) return `${IP_SUBJECT_TAG}${parts.join('.')}${prefix === 32 ? '' : `/${prefix}`}`;
  const groups = parts.map((g) => g.toString(16));
  if (prefix === 128) return `${IP_SUBJECT_TAG}${groups.join(':')}`;
  const covered = Math.ceil(prefix / 16);
  return covered === 8
    ? `${IP_SUBJECT_TAG}${groups.join(':')}/${prefix}`
    : `${IP_SUBJECT_TAG}${groups.slice(0, covered).join(':')}::/${prefix}`;
}

/**
 * The canonical subject of an address (or `ip:` + address, or `ip:` + network) bucketed by `prefixes`, or why
 * the text is none. Same input, same output; the output parses to itself.
 */
export function ipSubject(text: string, prefixes: IpPrefixes = DEFAULT_IP_PREFIXES): SubjectResult {
  if (text.length > MAX_IP_TEXT) return { ok: false, reason: 'subject is too long for an IP address' };
  const bare = text.startsWith(IP_SUBJECT_TAG) ? text.slice(IP_SUBJECT_TAG.length) : text;
  const parsed = parse(bare);
  if (typeof parsed === 'string') return { ok: false, reason: parsed };
  const prefix = parsed.family === 4 ? prefixes.ipv4Prefix : prefixes.ipv6Prefix;
  if (parsed.length !== undefined && parsed.length < prefix) {
    return {
      ok: false,
      reason: `${JSON.stringify(text)} is a /${parsed.length}, wider than the /${prefix} this policy counts IPv${parsed.family} clients by`,
    };
  }
  const bits = parsed.family === 4 ? 8 : 16;
  return { ok: true, subject: canonical(parsed.family, masked(parsed.parts, bits, prefix), prefix) };
}

/**
 * The canonical subject of a client address as a socket or a proxy header gives it (an address, no `ip:`, no
 * length), or undefined for text that is not one.
 */
export function clientAddressSubject(
  address: string,
  prefixes: IpPrefixes = DEFAULT_IP_PREFIXES,
): string | undefined {
  if (address.includes('/') || address.startsWith(IP_SUBJECT_TAG)) return undefined;
  const result = ipSubject(address, prefixes);
  return result.ok ? result.subject : undefined;
}
