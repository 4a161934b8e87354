/**
 * What a stolen agent credential can publish, through a real locked-down NATS to the real coordinator: the server
 * lets region eu's credential publish eu's heartbeats, usage and goodbyes (that is what it is for), so what stops
 * the forgeries is the coordinator. Usage naming another region, or from an agent id it never registered, moves
 * nothing; a goodbye forgets only the agent it names, which comes back at its next heartbeat; a bucket's records
 * (what a consumer the credential creates could push there) are dropped as invalid; 2,000 forged heartbeats register at most
 * maxAgentsPerRegion agents, and those are forgotten once silent, so shares are not pinned.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AllocationsResponse } from '../../../../core/wire/admin.js';
import { kvNames } from '../../../../core/wire/kv.js';
import {
  agentIdTag,
  credentialTag,
  protocolSubjects,
  RenewalReply,
  type Usage,
} from '../../../../core/wire/protocol.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';
import { firstHeartbeat } from '../../../helpers/protocol-messages.js';

const FORGET_AFTER_MS = 4000;
const MAX_AGENTS = 64;

describe('forged protocol messages with a stolen agent credential (real NATS, real coordinator)', () => {
  let stack: ServiceStack;
  let attacker: NatsConnection;
  /** The attacker's subjects: tagged with its own credential, the only ones the server lets it publish on. */
  let subjects: ReturnType<typeof protocolSubjects>;
  /** The attacker's credential tag: an agent id it makes up must start with it. */
  let tag: string;

  /** A sample of the coordinator's metrics (0 when the series does not exist yet). */
  const metric = async (name: string, labels: string): Promise<number> => {
    const text = (await stack.coordinator.app.inject({ url: '/metrics' })).body;
    const series = labels === '' ? `${name} ` : `${name}{${labels}} `;
    const line = text.split('\n').find((l) => l.startsWith(series));
    return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
  };
  const dropped = (kind: string, reason: string) =>
    metric('quotaplane_protocol_messages_dropped_total', `kind="${kind}",reason="${reason}"`);
  const engine = (counter: string) => metric('quotaplane_protocol_engine_counter', `counter="${counter}"`);
  /** Agents registered per region, lapsed or not. */
  const roster = async (): Promise<Record<string, number>> => {
    const res = await stack.admin('GET', '/v1/regions');
    const body = (await res.json()) as { regions: { region: string; agentDetails: unknown[] }[] };
    return Object.fromEntries(body.regions.map((r) => [r.region, r.agentDetails.length]));
  };
  const agentIdOf = (region: string) => stack.inRegion(region)[0]!.running.coordination!.holder.agentId;
  const usage = (agentId: string, region: string, seq: number): Usage => ({
    agentId,
    region,
    seq,
    intervalMs: 200,
    chunk: 0,
    chunks: 1,
    policies: [{ policy: 'demo', requested: 1e6, admitted: 0, denied: 1e6, demand: 1e6, constrained: [] }],
    dropped: 0,
  });
  const heartbeat = (agentId: string, instance: string, region: string) =>
    firstHeartbeat(agentId, region, { instance, mode: 'none' });

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      secure: { tls: false },
      lease: { forgetAfterMs: FORGET_AFTER_MS, maxAgentsPerRegion: MAX_AGENTS },
    });
    await stack.putPolicy('demo', { capacity: 90, refillPerSecond: 1.5 });
    await stack.ready(['demo']);
    const stolen = stack.nats.security!.bundle.credentials.find((c) => c.name === 'agent-eu-2')!;
    tag = credentialTag(stolen.publicKey);
    subjects = protocolSubjects(stack.namespace, tag);
    // Region eu's second credential: the one a thief of an eu agent's nkey holds (no running agent uses it).
    attacker = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-eu-2'),
      maxReconnectAttempts: 0,
    });
  }, 60_000);

  afterAll(async () => {
    await attacker?.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('usage or a heartbeat whose body names another region than its subject is dropped', async () => {
    const before = await dropped('usage', 'region_mismatch');
    const us = agentIdOf('us');
    for (let i = 0; i < 20; i++) attacker.publish(subjects.usage('eu'), JSON.stringify(usage(us, 'us', i)));
    await attacker.flush();
    await expect.poll(() => dropped('usage', 'region_mismatch'), { timeout: 5000 }).toBe(before + 20);
    // A heartbeat for a new us agent sent on eu's subject registers nothing and gets no renewal.
    await expect(
      attacker.request(
        subjects.heartbeat('eu'),
        JSON.stringify(heartbeat(`${tag}_forged-us-agent-01`, 'forged-us', 'us')),
        { timeout: 1000 },
      ),
    ).rejects.toThrow();
    expect(await dropped('heartbeat', 'region_mismatch')).toBe(1);
    expect(await roster()).toEqual({ us: 1, eu: 1, ap: 1 });
  });

  it('usage from an agent id the coordinator never registered moves no demand', async () => {
    const before = await engine('messagesDropped');
    /** What /v1/allocations answers of `demo` in eu: the demand, admitted and refused cost per second. */
    const shown = async () => {
      const body = AllocationsResponse.parse(await (await stack.admin('GET', '/v1/allocations')).json());
      const eu = body.policies.find((p) => p.policy === 'demo')!.regions!['eu']!;
      return { demand: eu.demandPerSecond, admitted: eu.admittedPerSecond, refused: eu.refusedPerSecond };
    };
    const shownBefore = await shown();
    const share = () => stack.inRegion('eu')[0]!.running.coordination!.holder.lease.shareFor('demo', 'x');
    const start = share()!.share;
    for (let i = 0; i < 20; i++) {
      attacker.publish(subjects.usage('eu'), JSON.stringify(usage(`${tag}_ghost-agent-0001`, 'eu', i)));
    }
    await attacker.flush();
    await expect.poll(() => engine('messagesDropped'), { timeout: 5000 }).toBe(before + 20);
    // Ten more rounds: a demand of 1e6 a round in eu would have moved eu's share by now.
    const rounds = await metric('quotaplane_rebalance_rounds_total', '');
    await expect
      .poll(async () => (await metric('quotaplane_rebalance_rounds_total', '')) >= rounds + 10, {
        timeout: 10_000,
      })
      .toBe(true);
    expect(share()!.share).toBe(start);
    // Nor does it reach what operators read of the region: a refused report is no report.
    expect(await shown()).toEqual(shownBefore);
  });

  it('a goodbye naming an agent id the coordinator never registered changes nothing', async () => {
    const before = await engine('messagesDropped');
    attacker.publish(
      subjects.bye('eu'),
      JSON.stringify({ agentId: `${tag}_ghost-agent-0001`, region: 'eu' }),
    );
    await attacker.flush();
    await expect.poll(() => engine('messagesDropped'), { timeout: 5000 }).toBe(before + 1);
    expect((await roster())['eu']).toBe(1);
  });

  it('goodbyes, acks, usage and heartbeats for another agent of the region are dropped: ids are bound to credentials', async () => {
    const victim = agentIdOf('eu');
    expect(agentIdTag(victim)).not.toBe(tag);
    const forgotten = await engine('agentsForgotten');
    const before = await Promise.all(['bye', 'ack', 'usage'].map((kind) => dropped(kind, 'agent_mismatch')));
    attacker.publish(subjects.bye('eu'), JSON.stringify({ agentId: victim, region: 'eu' }));
    attacker.publish(subjects.ack('eu'), JSON.stringify({ agentId: victim, region: 'eu', ackRevision: 1e9 }));
    attacker.publish(subjects.usage('eu'), JSON.stringify(usage(victim, 'eu', 0)));
    await attacker.flush();
    for (const [i, kind] of ['bye', 'ack', 'usage'].entries()) {
      await expect.poll(() => dropped(kind, 'agent_mismatch'), { timeout: 5000 }).toBe(before[i]! + 1);
    }
    // A heartbeat for the victim's id (it would keep a cut-off agent's lease alive) gets no renewal.
    const hbBefore = await dropped('heartbeat', 'agent_mismatch');
    await expect(
      attacker.request(subjects.heartbeat('eu'), JSON.stringify(heartbeat(victim, 'eu-victim', 'eu')), {
        timeout: 1000,
      }),
    ).rejects.toThrow();
    expect(await dropped('heartbeat', 'agent_mismatch')).toBe(hbBefore + 1);
    expect(await engine('agentsForgotten')).toBe(forgotten);
    expect((await roster())['eu']).toBe(1);
  });

  it('the server refuses a credential publishing on a subject tagged with another agent’s credential', async () => {
    const victimTag = agentIdTag(agentIdOf('eu'))!;
    const victimSubjects = protocolSubjects(stack.namespace, victimTag);
    const messages = () => metric('quotaplane_protocol_messages_total', 'kind="bye"');
    const seen = await messages();
    const witness = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-eu-3'),
      maxReconnectAttempts: 0,
    });
    try {
      witness.publish(victimSubjects.bye('eu'), JSON.stringify({ agentId: agentIdOf('eu'), region: 'eu' }));
      await witness.flush();
      // A message that did reach the coordinator after it (own subject) proves the first one would have too.
      const own = protocolSubjects(
        stack.namespace,
        credentialTag(
          stack.nats.security!.bundle.credentials.find((c) => c.name === 'agent-eu-3')!.publicKey,
        ),
      );
      witness.publish(own.bye('eu'), JSON.stringify({ agentId: agentIdOf('eu'), region: 'eu' }));
      await witness.flush();
      await expect.poll(messages, { timeout: 5000 }).toBe(seen + 1);
    } finally {
      await witness.close().catch(() => undefined);
    }
    expect((await roster())['eu']).toBe(1);
  });

  it('a new agent of another credential taking the real agent’s instance name does not replace it', async () => {
    const registrations = async () => {
      const res = await stack.admin('GET', '/v1/regions');
      const body = (await res.json()) as {
        regions: { region: string; agentDetails: { agentId: string; instance: string }[] }[];
      };
      return body.regions.find((r) => r.region === 'eu')!.agentDetails;
    };
    const real = (await registrations())[0]!;
    const reply = RenewalReply.parse(
      (
        await attacker.request(
          subjects.heartbeat('eu'),
          JSON.stringify(heartbeat(`${tag}_takeover-0001`, real.instance, 'eu')),
          { timeout: 2000 },
        )
      ).json(),
    );
    expect('refused' in reply).toBe(false);
    const after = await registrations();
    expect(after.map((a) => a.agentId).sort()).toEqual([real.agentId, `${tag}_takeover-0001`].sort());
    // Silent from now on, the takeover agent is forgotten; the real one stays.
    await expect
      .poll(async () => (await registrations()).map((a) => a.agentId), { timeout: FORGET_AFTER_MS + 10_000 })
      .toEqual([real.agentId]);
  });

  it('the buckets’ records, which a consumer the credential made can push onto any subject, are dropped as invalid there', async () => {
    const names = kvNames(stack.namespace);
    const kvm = new Kvm(jetstream(attacker));
    const records: string[] = [];
    for (const bucket of [names.policies, names.allocations]) {
      const kv = await kvm.open(bucket, { bindOnly: true });
      records.push((await kv.get('demo'))!.string());
    }
    const before = await Promise.all(['usage', 'ack', 'bye'].map((kind) => dropped(kind, 'invalid')));
    for (const record of records) {
      for (const subject of [subjects.usage('eu'), subjects.ack('eu'), subjects.bye('eu')]) {
        attacker.publish(subject, record);
      }
    }
    await attacker.flush();
    for (const [i, kind] of ['usage', 'ack', 'bye'].entries()) {
      await expect.poll(() => dropped(kind, 'invalid'), { timeout: 5000 }).toBe(before[i]! + 2);
    }
    expect(await roster()).toEqual({ us: 1, eu: 1, ap: 1 });
  });

  it('2,000 forged heartbeats register at most maxAgentsPerRegion agents, forgotten once silent', async () => {
    const forgottenBefore = await engine('agentsForgotten');
    const replies: RenewalReply[] = [];
    for (let batch = 0; batch < 8; batch++) {
      const answers = await Promise.all(
        Array.from({ length: 250 }, (_, i) => {
          const n = String(batch * 250 + i).padStart(6, '0');
          return attacker.request(
            subjects.heartbeat('eu'),
            JSON.stringify(heartbeat(`${tag}_forged-${n}`, `forged-instance-${n}`, 'eu')),
            { timeout: 10_000 },
          );
        }),
      );
      for (const a of answers) replies.push(RenewalReply.parse(a.json()));
    }
    expect(replies).toHaveLength(2000);
    const refused = replies.filter((r) => 'refused' in r);
    // The real eu agent holds one place: 63 forged agents get a lease, the other 1,937 are refused.
    expect(replies.length - refused.length).toBe(MAX_AGENTS - 1);
    expect(refused).toHaveLength(2000 - (MAX_AGENTS - 1));
    expect(refused.every((r) => 'refused' in r && r.refused.startsWith('region full'))).toBe(true);
    expect(await roster()).toEqual({ us: 1, eu: MAX_AGENTS, ap: 1 });

    // Silent from now on, the forged agents are forgotten after forgetAfterMs, and eu holds its real agent only.
    await expect.poll(async () => (await roster())['eu'], { timeout: FORGET_AFTER_MS + 10_000 }).toBe(1);
    expect(await engine('agentsForgotten')).toBe(forgottenBefore + MAX_AGENTS - 1);

    // Shares move again: us's demand (a subject well within its global rate) grows us's share past a third.
    const us = stack.inRegion('us')[0]!;
    const share = async () => {
      await Promise.all(
        Array.from({ length: 10 }, () => decide(us.url, { policy: 'demo', subject: 'us-demand' })),
      );
      return us.running.coordination!.holder.lease.shareFor('demo', 'us-demand')!.share;
    };
    await expect.poll(share, { timeout: 20_000, interval: 500 }).toBeGreaterThan(0.34);
  });
});
