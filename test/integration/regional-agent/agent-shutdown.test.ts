import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { describe, expect, inject, it } from 'vitest';
import type { DecideRequest, Decision } from '../../../core/wire/bucket.js';
import { systemClock } from '../../../core/clock.js';
import { parsePolicy } from '../../../core/policy/policy.js';
import { StaticShareView } from '../../../core/shares/shares.js';
import { buildApp } from '../../../regional-agent/app.js';
import { AgentConfig } from '../../../regional-agent/config.js';
import type { DecisionStore } from '../../../regional-agent/decisions/decision-store.js';
import { ModelDecisionStore } from '../../../regional-agent/decisions/model-decision-store.js';
import { StaticPolicySource } from '../../../regional-agent/policies/static-policy-source.js';
import { freePort } from '../../harness/ports.js';
import { eventually } from '../../helpers/wait.js';

/** The model store, answering after `delayMs`: decisions that are still in flight when shutdown begins. */
class SlowStore implements DecisionStore {
  readonly inner = new ModelDecisionStore(systemClock);
  started = 0;
  constructor(
    readonly delayMs: number,
    readonly events: string[],
  ) {}
  async decide(request: DecideRequest): Promise<Decision> {
    this.started++;
    await new Promise((r) => setTimeout(r, this.delayMs));
    this.events.push('decision finished');
    return this.inner.decide(request);
  }
  slotOf(key: string) {
    return this.inner.slotOf(key);
  }
  refund(...a: Parameters<DecisionStore['refund']>) {
    return this.inner.refund(...a);
  }
  claim(...a: Parameters<DecisionStore['claim']>) {
    return this.inner.claim(...a);
  }
  decideLog(...a: Parameters<DecisionStore['decideLog']>) {
    return this.inner.decideLog(...a);
  }
  refundLog(...a: Parameters<DecisionStore['refundLog']>) {
    return this.inner.refundLog(...a);
  }
  takeCreation(...a: Parameters<DecisionStore['takeCreation']>) {
    return this.inner.takeCreation(...a);
  }
  decideDay(...a: Parameters<DecisionStore['decideDay']>) {
    return this.inner.decideDay(...a);
  }
  refundDay(...a: Parameters<DecisionStore['refundDay']>) {
    return this.inner.refundDay(...a);
  }
}

const until = (check: () => boolean | Promise<boolean>, withinMs: number) =>
  eventually(check, withinMs, 'the condition', 20);

describe('graceful shutdown', () => {
  it('stops taking requests, finishes the ones in flight, then closes the store', async () => {
    const events: string[] = [];
    const store = new SlowStore(300, events);
    const agent = buildApp(
      {
        store,
        policies: new StaticPolicySource([parsePolicy({ name: 'writes', capacity: 10, refillPerSecond: 1 })]),
        shares: new StaticShareView(),
        log: pino({ level: 'silent' }),
        onClose: () => {
          events.push('store closed');
          return Promise.resolve();
        },
      },
      AgentConfig.parse({
        region: 'us',
        redisUrl: 'redis://127.0.0.1:1',
        policiesFile: 'x',
        decisionDeadlineMs: 2000,
        storeTimeoutMs: 2000,
      }),
    );
    await agent.ready;
    const url = await agent.app.listen({ host: '127.0.0.1', port: 0 });
    const inFlight = fetch(`${url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ policy: 'writes', subject: 's' }),
    }).then(async (res) => {
      return { status: res.status, body: (await res.json()) as { allowed: boolean } };
    });
    await until(() => store.started === 1, 2000);
    const closed = agent.close().then(() => events.push('closed'));
    // New connections are refused at once, while the first request is still being decided.
    const { port } = new URL(url);
    await until(
      () =>
        new Promise<boolean>((resolve) => {
          const socket = connect({ host: '127.0.0.1', port: Number(port) });
          socket.once('connect', () => {
            socket.destroy();
            resolve(false);
          });
          socket.once('error', () => resolve(true));
        }),
      2000,
    );
    expect(events).toEqual([]);
    const answer = await inFlight;
    await closed;
    expect(answer).toEqual({ status: 200, body: expect.objectContaining({ allowed: true }) as unknown });
    expect(events).toEqual(['decision finished', 'store closed', 'closed']);
  });

  it('main.ts: SIGHUP reloads policies; SIGTERM makes /readyz 503 at once, keeps deciding through the drain delay, then exits 0', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'qp-agent-'));
    const policies = join(dir, 'policies.json');
    writeFileSync(policies, JSON.stringify({ policies: { writes: { capacity: 10, refillPerSecond: 1 } } }));
    const port = await freePort();
    const { url: redisUrl } = inject('redis');
    const child = spawn(process.execPath, ['--import', 'tsx', 'regional-agent/main.ts'], {
      env: {
        ...process.env,
        QP_REGION: 'us',
        QP_REDIS_URL: redisUrl,
        QP_POLICIES_FILE: policies,
        QP_PORT: String(port),
        QP_DRAIN_DELAY_MS: '800',
        QP_LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    const base = `http://127.0.0.1:${port}`;
    try {
      await until(async () => {
        try {
          return (await fetch(`${base}/readyz`)).status === 200;
        } catch {
          return false;
        }
      }, 20_000);
      // SIGHUP reloads the policies file.
      const reads = () =>
        fetch(`${base}/v1/decisions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ policy: 'reads', subject: 's' }),
        });
      expect((await reads()).status).toBe(404);
      writeFileSync(
        policies,
        JSON.stringify({
          policies: {
            writes: { capacity: 10, refillPerSecond: 1 },
            reads: { capacity: 5, refillPerSecond: 1 },
          },
        }),
      );
      child.kill('SIGHUP');
      await until(async () => (await reads()).status === 200, 5000);
      child.kill('SIGTERM');
      await until(async () => (await fetch(`${base}/readyz`)).status === 503, 2000);
      const during = await fetch(`${base}/v1/decisions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ policy: 'writes', subject: `drain-${port}` }),
      });
      expect(during.status).toBe(200);
      expect(await exited).toBe(0);
    } catch (error) {
      child.kill('SIGKILL');
      throw new Error(`${(error as Error).message}\nagent output:\n${output}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 40_000);
});
