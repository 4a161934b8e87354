import { describe, expect, it } from 'vitest';
import { derInteger } from '../../../../coordinator/nats/tls-certificates.js';

const hex = (b: Buffer) => b.toString('hex');

describe('derInteger: minimal DER, as Go x509 (nats-server) requires of a serial number', () => {
  it('keeps a minimal positive integer as it is', () => {
    expect(hex(derInteger(Buffer.from([0x02])))).toBe('020102');
    expect(hex(derInteger(Buffer.from([0x7f, 0x01])))).toBe('02027f01');
  });

  it('adds a leading zero when the high bit is set', () => {
    expect(hex(derInteger(Buffer.from([0x80, 0x01])))).toBe('0203008001');
  });

  it('drops redundant leading zeros (a serial whose first random byte masked to 0)', () => {
    expect(hex(derInteger(Buffer.from([0x00, 0x12, 0x34])))).toBe('02021234');
    expect(hex(derInteger(Buffer.from([0x00, 0x00, 0x92])))).toBe('0202' + '0092');
    expect(hex(derInteger(Buffer.from([0x00])))).toBe('020100');
  });
});
