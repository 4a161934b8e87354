import { describe, expect, it } from 'vitest';
import { inboxPrefix, MESSAGE_SUBJECTS, natsPermissions } from '../../../../core/wire/nats-permissions.js';

const INBOX = inboxPrefix('UABC');

describe('NATS permissions by role', () => {
  it('an agent publishes its own region’s messages and requests to any region, never a KV or audit subject', () => {
    const p = natsPermissions('qp', { kind: 'agent', region: 'us' }, INBOX);
    expect(p.publish.allow).toEqual(
      expect.arrayContaining([
        'qp.v1.heartbeat.us',
        'qp.v1.usage.us',
        'qp.v1.ack.us',
        'qp.v1.bye.us',
        'qp.v1.strict.*',
        'qp.v1.loan.*',
      ]),
    );
    expect(p.publish.allow.filter((s) => s.startsWith('$KV') || s.startsWith('qp.audit'))).toEqual([]);
    expect(p.publish.allow.filter((s) => s.includes('.eu'))).toEqual([]);
    expect(p.publish.allow.filter((s) => /PURGE|DELETE|UPDATE|STREAM\.CREATE/.test(s))).toEqual([]);
    expect(p.publish.allow.some((s) => s.includes('KV_qp-agents') || s.includes('qp-audit'))).toBe(false);
    expect(p.subscribe.allow).toEqual(['_INBOX_UABC.>', 'qp.v1.strict.us', 'qp.v1.loan.us']);
  });

  it('the coordinator reads every region’s messages and owns the buckets and the audit stream', () => {
    const p = natsPermissions('qp', { kind: 'coordinator' }, INBOX);
    expect(p.subscribe.allow).toEqual([
      '_INBOX_UABC.>',
      'qp.v1.heartbeat.>',
      'qp.v1.usage.>',
      'qp.v1.ack.>',
      'qp.v1.bye.>',
    ]);
    for (const written of ['$KV.qp-policies.>', '$KV.qp-allocations.>', '$KV.qp-agents.>', 'qp.audit.>']) {
      expect(p.publish.allow).toContain(written);
    }
    expect(p.publish.allow.some((s) => s.startsWith('qp.v1.'))).toBe(false);
  });

  it('an agent with a credential tag publishes its region’s messages under that tag only', () => {
    const p = natsPermissions('qp', { kind: 'agent', region: 'us', tag: 'UTAG' }, INBOX);
    const own = p.publish.allow.filter((s) => /^qp\.v1\.(heartbeat|usage|ack|bye)\./.test(s));
    expect(own).toEqual([
      'qp.v1.heartbeat.us.UTAG',
      'qp.v1.usage.us.UTAG',
      'qp.v1.ack.us.UTAG',
      'qp.v1.bye.us.UTAG',
    ]);
  });

  it('a new message subject is one row, scoped the same way for both roles', () => {
    const scopes = Object.fromEntries(MESSAGE_SUBJECTS.map((r) => [r.name, r.scope]));
    expect(scopes).toEqual({
      heartbeat: 'from-region',
      usage: 'from-region',
      ack: 'from-region',
      bye: 'from-region',
      strict: 'to-region',
      loan: 'to-region',
    });
  });

  it('refuses a namespace that is not one', () => {
    expect(() => natsPermissions('Bad NS', { kind: 'coordinator' }, INBOX)).toThrow();
  });
});
