/**
 * Registration before renewal (docs/protocol.md, "Registration before renewal"), on real NATS and JetStream KV: the
 * coordinator answers a new agent's heartbeat with a renewal only once the agent's registration is in the agents
 * bucket, so a successor that reads the bucket knows every agent that may hold a lease. 20 new agents heartbeat at
 * once; the moment each renewal arrives, that agent's registration must already be readable (before the rule the
 * 20 replies all left before the first registry write).
 */
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { afterAll, describe, expect, it } from 'vitest';
import { kvNames } from '../../../../core/wire/kv.js';
import { protocolSubjects, RenewalReply } from '../../../../core/wire/protocol.js';
import { firstHeartbeat } from '../../../helpers/protocol-messages.js';
import { startProtocolStack, type ProtocolStack } from '../../../helpers/fixture/index.js';

describe('a renewal goes out only after its agent is registered (real NATS and KV)', () => {
  let stack: ProtocolStack | undefined;
  let nc: NatsConnection | undefined;

  afterAll(async () => {
    await nc?.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('each of 20 new agents is in the agents bucket when its first renewal arrives', async () => {
    stack = await startProtocolStack({ agentsPerRegion: 0 });
    nc = await connect({ servers: stack.nats.url });
    const agents = await new Kvm(jetstream(nc)).open(kvNames(stack.namespace).agents);
    const subject = protocolSubjects(stack.namespace, 'open').heartbeat('eu');
    const ids = Array.from({ length: 20 }, (_, i) => `open_fresh${i}`);
    const seen = await Promise.all(
      ids.map(async (id) => {
        const msg = await nc!.request(subject, JSON.stringify(firstHeartbeat(id, 'eu', { mode: 'none' })), {
          timeout: 5000,
        });
        const reply = RenewalReply.parse(msg.json());
        // Read at once, on the reply's arrival.
        const entry = await agents.get(id);
        return { id, renewed: !('refused' in reply), registered: entry?.operation === 'PUT' };
      }),
    );
    expect(seen).toEqual(ids.map((id) => ({ id, renewed: true, registered: true })));
  });
});
