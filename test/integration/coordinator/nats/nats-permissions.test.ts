/**
 * The locked-down NATS configuration against a real nats-server: every role can do what the protocol needs, and
 * the server refuses every forgery an attacker on the network (no credentials) or a holder of an agent's
 * credentials could try: writing policies, allocations or the agent registry, appending to or purging the audit
 * stream, publishing another region's usage, heartbeats, acks or goodbyes, reading another client's replies,
 * answering a heartbeat, or listening to a region's strict checks.
 */
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kvNames } from '../../../../core/wire/kv.js';
import { inboxPrefix } from '../../../../core/wire/nats-permissions.js';
import { credentialTag, protocolSubjects } from '../../../../core/wire/protocol.js';
import { loanSubject } from '../../../../core/wire/loan.js';
import { strictSubject } from '../../../../core/wire/strict.js';
import type { NatsServer } from '../../../harness/backend.js';
import { backend } from '../../../harness/fixtures.js';

const NS = 'perm';
const names = kvNames(NS);
const subjects = protocolSubjects(NS);
/** The subjects of the credential named `name`: tagged with it, the only ones it may publish protocol messages on. */
const tagged = (name: string) =>
  protocolSubjects(
    NS,
    credentialTag(nats.security!.bundle.credentials.find((c) => c.name === name)!.publicKey),
  );

let nats: NatsServer;
let coordinator: NatsConnection;
let us: NatsConnection;
let eu: NatsConnection;

const as = (name: string) =>
  connect({ servers: nats.url, ...nats.security!.connectOptions(name), maxReconnectAttempts: 0 });

/** A request the server refuses to carry: it rejects at once with a permissions violation naming the subject. */
async function refusedRequest(nc: NatsConnection, subject: string, body = '{}'): Promise<void> {
  await expect(nc.request(subject, body, { timeout: 2000 })).rejects.toThrow(
    `Permissions Violation for Publish to "${subject}"`,
  );
}

/** A subscription the server refuses: the subscription closes with a permissions violation naming it. */
async function refusedSubscription(nc: NatsConnection, subject: string): Promise<void> {
  const sub = nc.subscribe(subject);
  const closed = await sub.closed;
  expect(closed).toBeInstanceOf(Error);
  expect((closed as Error).message).toBe(`Permissions Violation for Subscription to "${subject}"`);
}

beforeAll(async () => {
  nats = await backend().startNats({
    jetstream: true,
    secure: { namespace: NS, regions: ['us', 'eu'], agentsPerRegion: 2 },
  });
  coordinator = await as('coordinator');
  const kvm = new Kvm(jetstream(coordinator));
  for (const bucket of [names.policies, names.allocations, names.agents]) await kvm.create(bucket);
  const jsm = await jetstreamManager(coordinator);
  await jsm.streams.add({ name: names.auditStream, subjects: [`${names.auditSubjectPrefix}.>`] });
  const policies = await kvm.open(names.policies);
  await policies.put('demo', JSON.stringify({ capacity: 90 }));
  const allocations = await kvm.open(names.allocations);
  await allocations.put('demo', JSON.stringify({ shares: { us: 0.5, eu: 0.5 } }));
  await jetstream(coordinator).publish(`${names.auditSubjectPrefix}.demo`, '{"actor":"admin"}');
  us = await as('agent-us-1');
  eu = await as('agent-eu-1');
});

afterAll(async () => {
  await Promise.all([coordinator, us, eu].map((nc) => nc?.close()));
  await nats?.[Symbol.asyncDispose]();
});

describe('who may connect', () => {
  it('refuses a client without credentials', async () => {
    await expect(connect({ servers: nats.url, maxReconnectAttempts: 0 })).rejects.toThrow(
      /Authorization Violation/,
    );
  });
});

describe('what an agent may do', () => {
  it('reads the policies and allocations buckets (bind, status, get, watch)', async () => {
    const kvm = new Kvm(jetstream(us));
    for (const [bucket, expected] of [
      [names.policies, { capacity: 90 }],
      [names.allocations, { shares: { us: 0.5, eu: 0.5 } }],
    ] as const) {
      const kv = await kvm.open(bucket, { bindOnly: true });
      expect((await kv.status()).values).toBe(1);
      expect((await kv.get('demo'))?.json()).toEqual(expected);
      const watch = await kv.watch();
      for await (const entry of watch) {
        expect(entry.key).toBe('demo');
        break;
      }
      watch.stop();
    }
  });

  it('sends its own heartbeats and gets the coordinator’s reply in its own inbox', async () => {
    const sub = coordinator.subscribe(subjects.all.heartbeat, {
      callback: (_error, msg) => void msg.respond(JSON.stringify({ to: msg.subject })),
    });
    await coordinator.flush();
    try {
      const own = tagged('agent-us-1');
      const reply = await us.request(own.heartbeat('us'), '{}', { timeout: 2000 });
      expect(reply.json()).toEqual({ to: own.heartbeat('us') });
    } finally {
      sub.unsubscribe();
    }
  });

  it('forwards a strict check to another region, whose agent answers', async () => {
    const { subject, queue } = strictSubject(NS, 'eu');
    const sub = eu.subscribe(subject, { queue, callback: (_e, msg) => void msg.respond('{"results":[]}') });
    await eu.flush();
    try {
      expect((await us.request(subject, '{}', { timeout: 2000 })).string()).toBe('{"results":[]}');
    } finally {
      sub.unsubscribe();
    }
  });

  it('asks another region for a loan, whose agent answers in the asker’s inbox', async () => {
    const { subject, queue } = loanSubject(NS, 'eu');
    const sub = eu.subscribe(subject, {
      queue,
      callback: (_e, msg) => void msg.respond('{"grantedMicros":0}'),
    });
    await eu.flush();
    try {
      expect((await us.request(subject, '{}', { timeout: 2000 })).string()).toBe('{"grantedMicros":0}');
    } finally {
      sub.unsubscribe();
    }
  });

  it('publishes its usage, acks and goodbyes (the coordinator receives them)', async () => {
    const got: string[] = [];
    const subs = [subjects.all.usage, subjects.all.ack, subjects.all.bye].map((s) =>
      coordinator.subscribe(s, { callback: (_e, msg) => void got.push(msg.subject) }),
    );
    await coordinator.flush();
    const own = tagged('agent-us-1');
    for (const subject of [own.usage('us'), own.ack('us'), own.bye('us')]) us.publish(subject, '{}');
    await us.flush();
    await expect.poll(() => got.length, { timeout: 2000 }).toBe(3);
    for (const sub of subs) sub.unsubscribe();
    expect(got.sort()).toEqual([own.ack('us'), own.bye('us'), own.usage('us')].sort());
  });
});

describe('forgeries the server refuses from an agent’s credentials', () => {
  it('writing an allocation record, a policy or the agent registry', async () => {
    for (const bucket of [names.allocations, names.policies, names.agents]) {
      await refusedRequest(us, `$KV.${bucket}.demo`, JSON.stringify({ shares: { us: 1, eu: 1 } }));
    }
    const kvm = new Kvm(jetstream(us));
    const kv = await kvm.open(names.allocations, { bindOnly: true });
    await expect(kv.put('demo', '{"shares":{"us":1,"eu":1}}')).rejects.toThrow(/Permissions Violation/);
    await expect(kv.delete('demo')).rejects.toThrow(/Permissions Violation/);
    // Nothing changed: the coordinator still reads its own record.
    const own = await new Kvm(jetstream(coordinator)).open(names.allocations);
    expect((await own.get('demo'))?.json()).toEqual({ shares: { us: 0.5, eu: 0.5 } });
  });

  it('opening the agent registry or the audit stream at all', async () => {
    await refusedRequest(us, `$JS.API.STREAM.INFO.KV_${names.agents}`);
    await refusedRequest(us, `$JS.API.STREAM.INFO.${names.auditStream}`);
    await refusedRequest(us, `$JS.API.CONSUMER.CREATE.${names.auditStream}`);
  });

  it('appending to the audit stream, purging or deleting it, or editing a bucket', async () => {
    await refusedRequest(us, `${names.auditSubjectPrefix}.demo`, '{"actor":"admin"}');
    await refusedRequest(us, `$JS.API.STREAM.PURGE.${names.auditStream}`);
    await refusedRequest(us, `$JS.API.STREAM.DELETE.${names.auditStream}`);
    await refusedRequest(us, `$JS.API.STREAM.PURGE.KV_${names.policies}`);
    await refusedRequest(us, `$JS.API.STREAM.UPDATE.KV_${names.allocations}`);
    await refusedRequest(us, `$JS.API.STREAM.MSG.DELETE.KV_${names.policies}`);
    await refusedRequest(us, `$JS.API.STREAM.CREATE.forged`);
    const info = await (await jetstreamManager(coordinator)).streams.info(names.auditStream);
    expect(info.state.messages).toBe(1);
  });

  it('publishing another region’s usage, heartbeats, acks or goodbyes', async () => {
    for (const subject of [
      subjects.usage('eu'),
      subjects.heartbeat('eu'),
      subjects.ack('eu'),
      subjects.bye('eu'),
    ]) {
      await refusedRequest(us, subject);
    }
  });

  it('speaking for another agent of its own region: its credential’s tag, or no tag at all', async () => {
    const other = tagged('agent-us-2');
    for (const subject of [
      other.usage('us'),
      other.heartbeat('us'),
      other.ack('us'),
      other.bye('us'),
      subjects.usage('us'),
      subjects.heartbeat('us'),
      subjects.ack('us'),
      subjects.bye('us'),
    ]) {
      await refusedRequest(us, subject);
    }
  });

  it('listening to heartbeats, usage or another region’s strict checks and loans', async () => {
    await refusedSubscription(us, subjects.all.heartbeat);
    await refusedSubscription(us, subjects.heartbeat('us'));
    await refusedSubscription(us, subjects.usage('eu'));
    await refusedSubscription(us, strictSubject(NS, 'eu').subject);
    await refusedSubscription(us, loanSubject(NS, 'eu').subject);
    await refusedSubscription(us, '>');
  });

  it('reading or forging replies in another client’s inbox', async () => {
    const euInbox = inboxPrefix(
      nats.security!.bundle.credentials.find((c) => c.name === 'agent-eu-1')!.publicKey,
    );
    await refusedSubscription(us, `${euInbox}.>`);
    await refusedSubscription(us, '_INBOX.>');
    // A forged renewal (leaseMs: 2e9) or a forged strict "allowed" sent straight to the victim's inbox.
    await refusedRequest(us, `${euInbox}.forged`, JSON.stringify({ leaseMs: 2e9 }));
  });
});

describe('consumers an agent’s credential may create on a bucket it reads', () => {
  const stream = `KV_${names.policies}`;
  const filter = `$KV.${names.policies}.>`;
  const create = (nc: NatsConnection, subject: string, config: Record<string, unknown>) =>
    nc.request(subject, JSON.stringify({ stream_name: stream, config }), { timeout: 2000 });

  it('only the named, filtered form the KV client uses: the legacy and unfiltered forms are refused', async () => {
    await refusedRequest(us, `$JS.API.CONSUMER.CREATE.${stream}`);
    await refusedRequest(us, `$JS.API.CONSUMER.CREATE.${stream}.evil`);
    await refusedRequest(us, `$JS.API.CONSUMER.DURABLE.CREATE.${stream}.evil`);
    await refusedRequest(us, `$JS.API.CONSUMER.CREATE.${stream}.evil.$KV.${names.allocations}.>`);
    await refusedRequest(us, `$JS.API.CONSUMER.DELETE.${stream}.evil`);
    await refusedRequest(us, `$JS.API.CONSUMER.CREATE.KV_${names.agents}.evil.$KV.${names.agents}.>`);
  });

  it('residual (the server cannot read the request): a durable one, or one pushing the bucket’s records onto any subject', async () => {
    const durable = await create(us, `$JS.API.CONSUMER.CREATE.${stream}.stays.${filter}`, {
      name: 'stays',
      durable_name: 'stays',
      filter_subject: filter,
      ack_policy: 'explicit',
    });
    expect(durable.json<{ config: { durable_name?: string } }>().config.durable_name).toBe('stays');
    // A push consumer delivering the policies bucket onto eu's usage subject, which the credential may not publish.
    const seen: string[] = [];
    const sub = coordinator.subscribe(subjects.usage('eu'), {
      callback: (_e, msg) => void seen.push(msg.string()),
    });
    await coordinator.flush();
    try {
      await create(us, `$JS.API.CONSUMER.CREATE.${stream}.push.${filter}`, {
        name: 'push',
        filter_subject: filter,
        ack_policy: 'none',
        deliver_subject: subjects.usage('eu'),
      });
      // Only records the coordinator wrote can travel that way; the coordinator drops them as invalid protocol
      // messages (test/integration/coordinator/protocol/protocol-forgery.test.ts).
      await expect.poll(() => seen, { timeout: 2000 }).toEqual([JSON.stringify({ capacity: 90 })]);
    } finally {
      sub.unsubscribe();
      const jsm = await jetstreamManager(coordinator);
      for (const name of ['stays', 'push']) await jsm.consumers.delete(stream, name);
    }
  });
});

describe('what the coordinator may not do', () => {
  it('answer strict checks or loans, or impersonate an agent', async () => {
    await refusedSubscription(coordinator, strictSubject(NS, 'us').subject);
    await refusedSubscription(coordinator, loanSubject(NS, 'us').subject);
    await refusedRequest(coordinator, subjects.heartbeat('us'));
  });
});
