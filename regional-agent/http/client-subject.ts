import ipaddr from 'ipaddr.js';

/**
 * The subject of an anonymous client: its IPv4 address, or its IPv6 /64 (one customer's network usually holds a
 * whole /64, so per-address buckets would let it rotate addresses forever). IPv4-mapped IPv6 counts as IPv4.
 * Returns undefined for text that is not an address.
 */
export function ipSubject(address: string): string | undefined {
  if (!ipaddr.isValid(address)) return undefined;
  let ip = ipaddr.parse(address);
  if (ip.kind() === 'ipv6' && (ip as ipaddr.IPv6).isIPv4MappedAddress()) {
    ip = (ip as ipaddr.IPv6).toIPv4Address();
  }
  if (ip.kind() === 'ipv4') return `ip:${ip.toString()}`;
  const parts = (ip as ipaddr.IPv6).parts.slice(0, 4);
  const prefix = new ipaddr.IPv6([...parts, 0, 0, 0, 0]);
  return `ip:${prefix
    .toNormalizedString()
    .split(':')
    .slice(0, 4)
    .map((p) => p.replace(/^0+(?=.)/, ''))
    .join(':')}::/64`;
}
