import { describe, expect, it } from 'vitest';
import { HASHED_PREFIX, normalizeSubject, subjectFingerprint } from '../../../../core/subjects/subject.js';

describe('subject normalization', () => {
  it.each(['tenant-42', 'user:42', 'ip:2001:db8::/64', 'key_AbC.9@x+y=z', 'a'.repeat(96)])(
    'accepts %s as is',
    (s) => {
      expect(normalizeSubject(s)).toEqual({ ok: true, subject: s });
    },
  );

  it.each([
    ['', 'subject is empty'],
    ['a'.repeat(97), 'subject is longer than 96 characters'],
    ['tenant{1}', 'subject may only contain A-Z a-z 0-9 . _ : / @ + = -'],
    ['with space', 'subject may only contain A-Z a-z 0-9 . _ : / @ + = -'],
    ['ünïcode', 'subject may only contain A-Z a-z 0-9 . _ : / @ + = -'],
    ['h.abc', 'subject may not start with "h."'],
  ])('refuses %j', (s, reason) => {
    expect(normalizeSubject(s)).toEqual({ ok: false, reason });
  });

  it('hashes with HMAC-SHA256 when a secret is configured: stable, keyed, never the raw value', () => {
    const a = normalizeSubject('alice@example.com', { hmacSecret: 's1' });
    const b = normalizeSubject('alice@example.com', { hmacSecret: 's1' });
    const c = normalizeSubject('alice@example.com', { hmacSecret: 's2' });
    expect(a).toEqual(b);
    expect(a).not.toEqual(c);
    if (!a.ok) throw new Error('expected ok');
    expect(a.subject).toMatch(/^h\.[A-Za-z0-9_-]{43}$/);
    expect(a.subject.startsWith(HASHED_PREFIX)).toBe(true);
    expect(a.subject).not.toContain('alice');
    // Known answer from openssl: printf alice@example.com | openssl dgst -sha256 -hmac s1 -binary | base64url
    expect(a.subject).toBe('h.' + 'LArt-FXw48LbvIyFObBnOOgZCaxb3iW7e6Ku_4O8gDk');
  });

  it('still refuses empty, oversized or control-character input when hashing', () => {
    expect(normalizeSubject('', { hmacSecret: 'k' }).ok).toBe(false);
    expect(normalizeSubject('x'.repeat(1025), { hmacSecret: 'k' }).ok).toBe(false);
    expect(normalizeSubject('a\nb', { hmacSecret: 'k' }).ok).toBe(false);
    // C1 controls too.
    expect(normalizeSubject('b\u0085', { hmacSecret: 'k' }).ok).toBe(false);
    expect(normalizeSubject('b\u009f', { hmacSecret: 'k' }).ok).toBe(false);
    expect(normalizeSubject('b\u00a0', { hmacSecret: 'k' }).ok).toBe(true);
  });

  it('refuses a lone surrogate when hashing: UTF-8 would make it U+FFFD, one bucket for many subjects', () => {
    for (const raw of ['a\ud800', 'a\udc00', '\udc00\ud800', 'x\ud83d']) {
      expect(normalizeSubject(raw, { hmacSecret: 'k' })).toEqual({
        ok: false,
        reason: 'subject is not well-formed Unicode (a lone surrogate)',
      });
    }
    // A pair is one character (an emoji), and U+FFFD itself is an ordinary character.
    expect(normalizeSubject('a\ud83d\ude00', { hmacSecret: 'k' }).ok).toBe(true);
    expect(normalizeSubject('a\ufffd', { hmacSecret: 'k' }).ok).toBe(true);
  });

  it('fingerprints are short, stable and one-way', () => {
    expect(subjectFingerprint('tenant-42', 'k1')).toHaveLength(12);
    expect(subjectFingerprint('tenant-42', 'k1')).toBe(subjectFingerprint('tenant-42', 'k1'));
    expect(subjectFingerprint('tenant-42', 'k1')).not.toContain('42');
    // Keyed: without the key a dictionary of identities cannot be matched against the logs.
    expect(subjectFingerprint('tenant-42', 'k2')).not.toBe(subjectFingerprint('tenant-42', 'k1'));
  });
});
