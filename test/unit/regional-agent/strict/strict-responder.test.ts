/**
 * The home side of strict mode, on a stand-in NATS connection: each way a home sheds a forwarded request
 * (taken up after its deadline, refused by admission control, its store call past the deadline) answers
 * `overloaded` in its own words and is counted by path.
 */
import type { NatsConnection } from '@nats-io/nats-core';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import {
  homeShedOf,
  HOME_SHED_WORDS,
  type ForwardedDecision,
  type ForwardedReply,
} from '../../../../core/wire/strict.js';
import {
  StrictResponder,
  type ForwardedDecider,
} from '../../../../regional-agent/strict/strict-responder.js';

type Callback = (
  error: Error | null,
  msg: { data: Uint8Array; reply?: string; respond(data: string): boolean },
) => void;

/** A responder on a connection that hands each published request to its callback and keeps the answers. */
function home(options: { decide?: ForwardedDecider; admit?: () => (() => void) | string }) {
  let callback: Callback | undefined;
  const nc = {
    subscribe: (_subject: string, opts: { callback: Callback }) => {
      callback = opts.callback;
      return { unsubscribe: () => undefined };
    },
  } as unknown as NatsConnection;
  const registry = new Registry();
  const responder = new StrictResponder({
    nc,
    region: 'ap',
    namespace: 'qp',
    registry,
    decide: options.decide ?? (() => Promise.resolve({ results: [] } as unknown as ForwardedReply)),
    ...(options.admit ? { admit: options.admit } : {}),
  });
  responder.start();
  const ask = (body: ForwardedDecision) =>
    new Promise<ForwardedReply>((resolve) => {
      callback!(null, {
        data: new TextEncoder().encode(JSON.stringify(body)),
        reply: '_INBOX.x',
        respond: (data) => {
          resolve(JSON.parse(data) as ForwardedReply);
          return true;
        },
      });
    });
  const shed = async () => registry.getSingleMetricAsString('quotaplane_strict_shed_total');
  return { ask, shed };
}

const request = (deadlineAtMs: number): ForwardedDecision => ({
  fromRegion: 'eu',
  checks: [{ policy: 'p', subject: 's', cost: 1 }],
  dryRun: false,
  budgetMs: 500,
  deadlineAtMs,
});

describe('a home shedding a forwarded request', () => {
  it('taken up after its deadline: answered `late` with how late, never decided', async () => {
    let decided = 0;
    const { ask, shed } = home({
      decide: () => {
        decided++;
        return Promise.resolve({ error: 'failed', message: 'x' });
      },
    });
    const deadlineAtMs = Date.now() - 40;
    const reply = await ask(request(deadlineAtMs));
    const lateAtMost = Date.now() - deadlineAtMs;
    expect(reply).toMatchObject({ error: 'overloaded' });
    const message = (reply as { message: string }).message;
    expect(homeShedOf(message)).toBe('late');
    // How late: at least the 40 ms given, at most the time until the answer was read (a busy machine adds to it).
    const late = Number(/\((\d+) ms after it\)$/.exec(message)?.[1]);
    expect(late).toBeGreaterThanOrEqual(40);
    expect(late).toBeLessThanOrEqual(lateAtMost);
    expect(decided).toBe(0);
    expect(await shed()).toContain('quotaplane_strict_shed_total{from="eu",path="late"} 1');
  });

  it('refused by admission control: answered `admission` with the cause', async () => {
    const { ask, shed } = home({ admit: () => 'in_flight' });
    const reply = await ask(request(Date.now() + 10_000));
    expect(reply).toEqual({ error: 'overloaded', message: `${HOME_SHED_WORDS.admission} (in flight)` });
    expect(await shed()).toContain('quotaplane_strict_shed_total{from="eu",path="admission"} 1');
  });

  it("its store call past the deadline: the decider's `overloaded` answer is counted as store_deadline", async () => {
    const { ask, shed } = home({
      decide: () =>
        Promise.resolve({
          error: 'overloaded',
          message: `The agent is overloaded (store_deadline: ${HOME_SHED_WORDS.store_deadline}): nothing was decided or charged; retry after Retry-After`,
        }),
    });
    const reply = await ask(request(Date.now() + 10_000));
    expect(homeShedOf((reply as { message: string }).message)).toBe('store_deadline');
    expect(await shed()).toContain('quotaplane_strict_shed_total{from="eu",path="store_deadline"} 1');
  });
});
