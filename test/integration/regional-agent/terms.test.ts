/**
 * Direct decisions on a real Redis: a term from a real agent, then the agent's own script run by the test (as a
 * client would) with the term's bucket and deadline, on the agent's own keys.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketKey } from '../../../core/keys.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { DecisionResponse } from '../../../core/wire/agent.js';
import { encodeRequest, parseReplies, scriptCall } from '../../../core/wire/bucket.js';
import { DeadlinePassedError } from '../../../core/wire/script.js';
import { TermResponse } from '../../../core/wire/term.js';
import { uniquePrefix } from '../../harness/fixtures.js';
import { agentFixture, type AgentFixture } from '../../helpers/agent-fixture.js';

const version = Number(uniquePrefix('').replace(/\D/g, '').slice(0, 5)) + 2;
const direct = parsePolicy({ name: 'direct', capacity: 100, refillPerSecond: 1e-4, version });

let agent: AgentFixture;

beforeAll(async () => {
  agent = await agentFixture({
    policies: [direct],
    clock: { sampleEveryMs: 1000 },
    config: { reservationSweepMs: 0, terms: 'on', termMs: 2000 },
  });
});
afterAll(async () => {
  await agent[Symbol.asyncDispose]();
});

async function term(): Promise<TermResponse> {
  const res = await agent.app.inject({
    method: 'POST',
    url: '/v1/terms',
    payload: { policy: 'direct', script: true },
  });
  expect(res.statusCode).toBe(200);
  return TermResponse.parse(res.json());
}

/** One direct check of `subject` under `t`, as a client runs it: EVALSHA of the term's script. */
async function check(t: TermResponse, subject: string, deadlineMicros = t.deadlineMicros) {
  const request = encodeRequest({
    checks: [{ key: bucketKey(t.version, subject, t.policy), cost: 1, ...t.bucket }],
  });
  const { keys, argv } = scriptCall([request], deadlineMicros);
  const reply = await agent.redis.evalsha(t.scriptSha, keys.length, ...keys, ...argv);
  return parseReplies(reply, [1])[0]!;
}

describe('direct decisions under a term, on a real Redis', () => {
  it("150 checks of the term's bucket (capacity 100, refill ~0) admit exactly 100; the agent then refuses the same subject", async () => {
    const t = await term();
    expect(t).toMatchObject({ policy: 'direct', version, limit: 100, validForMs: 2000 });
    // The script the term names is the one it sent.
    expect(await agent.redis.script('LOAD', t.script!)).toBe(t.scriptSha);
    const subject = 'direct-a';
    const replies = await Promise.all(Array.from({ length: 150 }, () => check(t, subject)));
    expect(replies.filter((r) => r.allowed)).toHaveLength(100);
    const res = await agent.app.inject({
      method: 'POST',
      url: '/v1/decisions',
      payload: { policy: 'direct', subject },
    });
    const decision = DecisionResponse.parse(res.json());
    expect(decision.allowed).toBe(false);
    expect(decision.results[0]).toMatchObject({ limit: 100, remaining: 0 });
  });

  it('a check whose deadline has passed answers {-1} and charges nothing', async () => {
    const t = await term();
    await agent.redis.script('LOAD', t.script!);
    const subject = 'direct-late';
    const key = bucketKey(t.version, subject, t.policy);
    await expect(check(t, subject, 1)).rejects.toBeInstanceOf(DeadlinePassedError);
    // The deadline an hour before the term's: long gone in Redis time.
    await expect(check(t, subject, t.deadlineMicros - 3_600_000_000)).rejects.toBeInstanceOf(
      DeadlinePassedError,
    );
    expect(await agent.redis.exists(key)).toBe(0);
    const first = await check(t, subject);
    expect(first.allowed).toBe(true);
    expect(first.results[0]!.remaining).toBe(99 * 1_000_000);
  });
});
