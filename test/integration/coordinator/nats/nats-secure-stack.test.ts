/**
 * The whole protocol on a locked-down NATS with TLS (the configuration the harness, `npm start` and the compose
 * file all generate with coordinator/nats/secrets-bundle.ts): the coordinator and three regions' agents connect
 * with their own nkeys, get leases, read policies and forward strict checks. Each attack is checked where it is
 * stopped: the server refuses a forged allocation record, a forged policy and a listener on another region's
 * strict checks from an agent's credential; a forged record that does get written (a stolen coordinator
 * credential may write) is refused by every agent.
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kvNames } from '../../../../core/wire/kv.js';
import { inboxPrefix } from '../../../../core/wire/nats-permissions.js';
import { strictSubject } from '../../../../core/wire/strict.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';

describe('a stack on locked-down NATS with TLS', () => {
  let stack: ServiceStack;

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      secure: { tls: true },
      agent: { decisionDeadlineMs: 5000, storeTimeoutMs: 5000 },
    });
    // Next to no refill (1 a day): exact counts for the length of the test.
    await stack.putPolicy('demo', { capacity: 90, refillPerSecond: 90 / 86_400 });
    await stack.putPolicy('refunds', {
      mode: 'strict',
      homeRegion: 'us',
      capacity: 5,
      refillPerSecond: 5 / 86_400,
    });
    await stack.ready(['demo', 'refunds']);
  }, 60_000);

  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  const asIdentity = (name: string) =>
    connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions(name),
      maxReconnectAttempts: 0,
    });

  it('serves over TLS only: a plain client, or one that does not trust the CA, cannot connect', async () => {
    expect(stack.nats.url.startsWith('tls://')).toBe(true);
    const { authenticator, inboxPrefix } = stack.nats.security!.connectOptions('agent-us-1');
    await expect(
      connect({ servers: stack.nats.url, authenticator, inboxPrefix, maxReconnectAttempts: 0 }),
    ).rejects.toThrow();
    await expect(connect({ servers: stack.nats.url, maxReconnectAttempts: 0 })).rejects.toThrow();
  });

  it('the server refuses a forged allocation record or policy from an agent’s credential: the records stay as written', async () => {
    const attacker = await asIdentity('agent-eu-1');
    try {
      const names = kvNames(stack.namespace);
      const kv = await new Kvm(jetstream(attacker)).open(names.allocations, { bindOnly: true });
      const own = (await kv.get('demo'))!;
      const forged = { ...own.json<Record<string, unknown>>() };
      forged['default'] = { shares: { us: 1, eu: 1, ap: 1 }, pending: {}, epoch: 999 };
      await expect(kv.put('demo', JSON.stringify(forged))).rejects.toThrow(/Permissions Violation/);
      const policies = await new Kvm(jetstream(attacker)).open(names.policies, { bindOnly: true });
      const policy = (await policies.get('demo'))!;
      await expect(policies.put('demo', JSON.stringify({ capacity: 1e6 }))).rejects.toThrow(
        /Permissions Violation/,
      );
      // Nothing was written: both keys are at the revisions they had.
      expect((await kv.get('demo'))!.revision).toBe(own.revision);
      expect((await policies.get('demo'))!.revision).toBe(policy.revision);
    } finally {
      await attacker.close();
    }
  });

  it('a forged 1/1/1 record written with a credential that may write is refused by every agent: 270 calls admit at most 90', async () => {
    const lease = (a: (typeof stack.agents)[number]) => a.running.coordination!.holder.lease;
    const refusedBefore = stack.agents.map((a) => lease(a).refusedRecords);
    const sharesBefore = stack.agents.map((a) => lease(a).shareFor('demo', 'acct-1')!.share);
    const thief = await asIdentity('coordinator');
    try {
      const kv = await new Kvm(jetstream(thief)).open(kvNames(stack.namespace).allocations, {
        bindOnly: true,
      });
      const own = (await kv.get('demo'))!.json<Record<string, unknown> & { epoch: number }>();
      const unit = own['default'] as { epoch: number };
      await kv.put(
        'demo',
        JSON.stringify({
          ...own,
          epoch: own.epoch + 1,
          default: { ...unit, shares: { us: 1, eu: 1, ap: 1 }, epoch: unit.epoch + 1 },
        }),
      );
    } finally {
      await thief.close();
    }
    // Every agent sees the record on its watch and refuses it (the running coordinator restores its own too).
    await expect
      .poll(() => stack.agents.map((a, i) => lease(a).refusedRecords - refusedBefore[i]!), {
        timeout: 10_000,
      })
      .toEqual(stack.agents.map(() => 1));
    expect(stack.agents.map((a) => lease(a).shareFor('demo', 'acct-1')!.share)).toEqual(sharesBefore);
    const answers = [];
    for (let i = 0; i < 90; i++) {
      answers.push(
        ...(await Promise.all(stack.agents.map((a) => decide(a.url, { policy: 'demo', subject: 'acct-1' })))),
      );
    }
    expect(answers).toHaveLength(270);
    const admitted = answers.filter((a) => a.body.allowed).length;
    expect(admitted).toBeLessThanOrEqual(90);
    expect(admitted).toBeGreaterThan(0);
  });

  it('the server refuses an eu credential listening on us’s strict checks or answering into an eu agent’s inbox', async () => {
    const attacker = await asIdentity('agent-eu-1');
    try {
      const sub = attacker.subscribe(strictSubject(stack.namespace, 'us').subject);
      expect(String(await sub.closed)).toMatch(/Permissions Violation for Subscription/);
    } finally {
      await attacker.close();
    }
    const other = await asIdentity('agent-us-1');
    try {
      const euInbox = inboxPrefix(
        stack.nats.security!.bundle.credentials.find((c) => c.name === 'agent-eu-1')!.publicKey,
      );
      await expect(
        other.request(`${euInbox}.forged`, JSON.stringify({ results: [{ allowed: true }] }), {
          timeout: 2000,
        }),
      ).rejects.toThrow(/Permissions Violation for Publish/);
    } finally {
      await other.close();
    }
  });

  it('strict checks forwarded from eu over the locked-down NATS reach the home region only: 20 forwarded admit exactly 5', async () => {
    const eu = stack.inRegion('eu')[0]!;
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => decide(eu.url, { policy: 'refunds', subject: 'acct-2' })),
    );
    expect(answers.filter((a) => a.body.allowed)).toHaveLength(5);
    expect(answers.every((a) => a.status === 200)).toBe(true);
  });

  it('the coordinator knows every region’s agent (heartbeats and usage arrive under the permissions)', async () => {
    await expect
      .poll(
        async () => {
          const res = await stack.admin('GET', '/v1/regions');
          const body = (await res.json()) as { regions: { region: string; agents: number }[] };
          return body.regions.map((r) => `${r.region}:${r.agents}`).sort();
        },
        { timeout: 10_000 },
      )
      .toEqual(['ap:1', 'eu:1', 'us:1']);
  });
});
