/**
 * A private certificate authority and a server certificate for NATS TLS, made with `node:crypto` alone (ECDSA
 * P-256, SHA-256), so a deployment can turn TLS on with nothing to install: the DER structures of RFC 5280
 * are assembled here and signed with `crypto.sign`. Clients trust the CA (`QP_NATS_TLS_CA_FILE`); the server
 * presents its certificate for the names and addresses it is reached at.
 */
import { createPrivateKey, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';
import { isIP } from 'node:net';

function length(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v >>= 8) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

function tlv(tag: number, ...content: Buffer[]): Buffer {
  const body = Buffer.concat(content);
  return Buffer.concat([Buffer.from([tag]), length(body.length), body]);
}

const seq = (...items: Buffer[]): Buffer => tlv(0x30, ...items);
const set = (...items: Buffer[]): Buffer => tlv(0x31, ...items);
const octets = (b: Buffer): Buffer => tlv(0x04, b);
const bits = (b: Buffer): Buffer => tlv(0x03, Buffer.from([0]), b);
const utf8 = (s: string): Buffer => tlv(0x0c, Buffer.from(s, 'utf8'));
const bool = (v: boolean): Buffer => tlv(0x01, Buffer.from([v ? 0xff : 0]));

/**
 * A non-negative DER INTEGER from big-endian bytes, minimal as DER requires: redundant leading zero bytes dropped
 * (Go's x509, which nats-server uses, refuses a serial number encoded with one), a leading 0 added when the high
 * bit is set.
 */
export function derInteger(b: Buffer): Buffer {
  let start = 0;
  while (start < b.length - 1 && b[start] === 0) start++;
  const bytes = b.subarray(start);
  return tlv(0x02, bytes[0]! & 0x80 ? Buffer.concat([Buffer.from([0]), bytes]) : bytes);
}

function oid(dotted: string): Buffer {
  const parts = dotted.split('.').map(Number);
  const out = [40 * parts[0]! + parts[1]!];
  for (const p of parts.slice(2)) {
    const chunk: number[] = [p & 0x7f];
    for (let v = p >> 7; v > 0; v >>= 7) chunk.unshift(0x80 | (v & 0x7f));
    out.push(...chunk);
  }
  return tlv(0x06, Buffer.from(out));
}

function time(date: Date): Buffer {
  const iso = date.toISOString().replace(/[-:T]/g, '').slice(0, 14) + 'Z';
  // UTCTime up to 2049, GeneralizedTime after (RFC 5280 4.1.2.5).
  return date.getUTCFullYear() < 2050 ? tlv(0x17, Buffer.from(iso.slice(2))) : tlv(0x18, Buffer.from(iso));
}

const ECDSA_SHA256 = seq(oid('1.2.840.10045.4.3.2'));

function name(commonName: string): Buffer {
  return seq(set(seq(oid('2.5.4.3'), utf8(commonName))));
}

function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return seq(oid(id), ...(critical ? [bool(true)] : []), octets(value));
}

function subjectAltNames(names: readonly string[]): Buffer {
  return seq(
    ...names.map((n) => {
      if (isIP(n) === 4) return tlv(0x87, Buffer.from(n.split('.').map(Number)));
      if (isIP(n) === 6) return tlv(0x87, ipv6Bytes(n));
      return tlv(0x82, Buffer.from(n, 'ascii'));
    }),
  );
}

function ipv6Bytes(address: string): Buffer {
  const [head = '', tail = ''] = address.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = tail === '' ? [] : tail.split(':');
  const groups = address.includes('::')
    ? [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t]
    : h;
  return Buffer.from(groups.flatMap((g) => [parseInt(g, 16) >> 8, parseInt(g, 16) & 0xff]));
}

interface CertificateSpec {
  subject: string;
  issuer: string;
  publicKey: KeyObject;
  signer: KeyObject;
  ca: boolean;
  altNames: readonly string[];
  notBefore: Date;
  notAfter: Date;
}

function certificate(spec: CertificateSpec): string {
  const keyUsage = spec.ca
    ? Buffer.from([0x03, 0x02, 0x01, 0x06]) // keyCertSign, cRLSign
    : Buffer.from([0x03, 0x02, 0x07, 0x80]); // digitalSignature
  const extensions = [
    extension('2.5.29.19', true, spec.ca ? seq(bool(true)) : seq()),
    extension('2.5.29.15', true, keyUsage),
  ];
  if (!spec.ca) {
    extensions.push(extension('2.5.29.37', false, seq(oid('1.3.6.1.5.5.7.3.1'))));
    extensions.push(extension('2.5.29.17', false, subjectAltNames(spec.altNames)));
  }
  const serial = randomBytes(16);
  serial[0] = serial[0]! & 0x7f;
  const tbs = seq(
    tlv(0xa0, derInteger(Buffer.from([2]))),
    derInteger(serial),
    ECDSA_SHA256,
    name(spec.issuer),
    seq(time(spec.notBefore), time(spec.notAfter)),
    name(spec.subject),
    spec.publicKey.export({ type: 'spki', format: 'der' }),
    tlv(0xa3, seq(...extensions)),
  );
  const signature = sign('sha256', tbs, spec.signer);
  const der = seq(tbs, ECDSA_SHA256, bits(signature));
  const lines = der.toString('base64').match(/.{1,64}/g) ?? [];
  return ['-----BEGIN CERTIFICATE-----', ...lines, '-----END CERTIFICATE-----', ''].join('\n');
}

/** PEM texts of a CA and of a server certificate it signed. */
export interface TlsMaterial {
  readonly caCert: string;
  readonly serverCert: string;
  readonly serverKey: string;
}

export interface TlsOptions {
  /** DNS names and IP addresses the server is reached at (subject alternative names). */
  readonly altNames: readonly string[];
  /** Validity, days. Default 825. */
  readonly days?: number;
  readonly now?: Date;
}

/** A fresh CA and a server certificate for `altNames`; the CA's private key is not kept. */
export function generateTlsMaterial(options: TlsOptions): TlsMaterial {
  const now = options.now ?? new Date();
  const notBefore = new Date(now.getTime() - 60_000);
  const notAfter = new Date(now.getTime() + (options.days ?? 825) * 86_400_000);
  const ca = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const server = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const caName = `quotaplane NATS CA ${randomBytes(4).toString('hex')}`;
  const common = { issuer: caName, signer: ca.privateKey, notBefore, notAfter };
  return {
    caCert: certificate({ ...common, subject: caName, publicKey: ca.publicKey, ca: true, altNames: [] }),
    serverCert: certificate({
      ...common,
      subject: options.altNames[0] ?? 'localhost',
      publicKey: server.publicKey,
      ca: false,
      altNames: options.altNames,
    }),
    serverKey: createPrivateKey(server.privateKey.export({ type: 'pkcs8', format: 'pem' })).export({
      type: 'pkcs8',
      format: 'pem',
    }) as string,
  };
}
