/**
 * No raw subject leaves an agent that hashes subjects (QP_HMAC_SECRET): not in its logs (every level, down to
 * trace), not in the usage reports it sends the coordinator over NATS (which name the subjects a region
 * constrained), not in the strict checks it forwards to the home region, and not in Redis.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { connect } from '@nats-io/transport-node';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { normalizeSubject } from '../../../core/subjects/subject.js';
import { protocolSubjects } from '../../../core/wire/protocol.js';
import { strictSubject } from '../../../core/wire/strict.js';
import { decide, startStack, STRICT_REFUNDS, type ServiceStack } from '../../helpers/fixture/index.js';

const SECRET = 'subject-privacy-secret-0123456789';
const RAW = 'alice.privacy@example.com';

describe('raw subjects never leave a hashing agent', () => {
  let stack: ServiceStack;
  const logs: string[] = [];
  const wire: string[] = [];
  let listeners: NatsConnection[] = [];

  beforeAll(async () => {
    stack = await startStack({
      agentsPerRegion: 1,
      secure: { tls: false },
      agent: { hmacSecret: SECRET, logLevel: 'trace' },
      log: pino({ level: 'trace' }, { write: (line: string) => void logs.push(line) }),
    });
    await stack.putPolicy('demo', { capacity: 3, refillPerSecond: 0.001, idleTtlSeconds: 10_000 });
    await stack.putPolicy('refunds', STRICT_REFUNDS);
    await stack.ready(['demo', 'refunds']);
    // What crosses NATS: usage as the coordinator reads it, strict checks as the home region's agents do.
    const coordinator = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('coordinator'),
    });
    coordinator.subscribe(protocolSubjects(stack.namespace).all.usage, {
      callback: (_e, msg) => void wire.push(msg.string()),
    });
    const home = await connect({
      servers: stack.nats.url,
      ...stack.nats.security!.connectOptions('agent-us-2'),
    });
    home.subscribe(strictSubject(stack.namespace, 'us').subject, {
      callback: (_e, msg) => void wire.push(msg.string()),
    });
    await Promise.all([coordinator.flush(), home.flush()]);
    listeners = [coordinator, home];
  }, 60_000);

  afterAll(async () => {
    for (const nc of listeners) await nc.close();
    await stack?.[Symbol.asyncDispose]();
  });

  it('logs, usage reports, forwarded strict checks and Redis keys carry the keyed hash only', async () => {
    const hashed = normalizeSubject(RAW, { hmacSecret: SECRET });
    if (!hashed.ok) throw new Error(hashed.reason);
    // Refusals make the subject a constrained one: the usage report names it.
    const us = stack.inRegion('us')[0]!;
    const eu = stack.inRegion('eu')[0]!;
    for (let i = 0; i < 6; i++) await decide(us.url, { policy: 'demo', subject: RAW });
    // A forwarded strict check, bad requests that name the subject, and a layered one.
    expect((await decide(eu.url, { policy: 'refunds', subject: RAW })).status).toBe(200);
    await decide(us.url, { policy: 'demo', subject: RAW, cost: 0.0000001 });
    await decide(us.url, { policy: 'nope', subject: RAW });
    await decide(us.url, {
      checks: [
        { policy: 'demo', subject: RAW },
        { policy: 'refunds', subject: RAW },
      ],
    });

    await expect
      .poll(() => wire.some((m) => m.includes(hashed.subject) && m.includes('"constrained"')), {
        timeout: 10_000,
      })
      .toBe(true);
    expect(wire.some((m) => m.includes(hashed.subject) && m.includes('"fromRegion"'))).toBe(true);
    const leaks = (texts: string[]) => texts.filter((t) => t.includes(RAW) || t.includes('alice.privacy'));
    expect(leaks(wire)).toEqual([]);
    expect(logs.length).toBeGreaterThan(0);
    expect(leaks(logs)).toEqual([]);
    for (const [region, server] of stack.redis) {
      const redis = new Redis(server.url);
      try {
        const keys = await redis.keys('*');
        expect(leaks(keys), region).toEqual([]);
        if (region === 'us') expect(keys.some((k) => k.includes(hashed.subject))).toBe(true);
      } finally {
        redis.disconnect();
      }
    }
  });
});
