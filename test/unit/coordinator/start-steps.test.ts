/**
 * A coordinator's start, step by step (coordinator/start-steps.ts): a failed step is tried again on its own while
 * the coordinator leads (the steps before it are not repeated), the error ends the start once it does not, and
 * the time of each step and of the whole start reaches the log and the gauges.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { StartSteps } from '../../../coordinator/start-steps.js';
import type { Logger } from '../../../coordinator/ports.js';

function recordingLog(): Logger & { lines: { level: string; obj: object; msg?: string }[] } {
  const lines: { level: string; obj: object; msg?: string }[] = [];
  const at =
    (level: string) =>
    (obj: object, msg?: string): void => {
      lines.push({ level, obj, ...(msg === undefined ? {} : { msg }) });
    };
  return { lines, error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug') };
}

describe('StartSteps', () => {
  it('tries only the failed step again while leading, and times every attempt', async () => {
    await Promise.resolve();
    let now = 0;
    const log = recordingLog();
    const steps = new StartSteps({ log, retry: () => true, retryMs: 1, now: () => now });
    const calls: string[] = [];
    await steps.run('open', async () => {
      await Promise.resolve();
      calls.push('open');
      now += 100;
    });
    let failuresLeft = 2;
    const value = await steps.run('load', async () => {
      await Promise.resolve();
      calls.push('load');
      now += 1500;
      if (failuresLeft-- > 0) throw new Error('timeout');
      return 7;
    });
    expect(value).toBe(7);
    expect(calls).toEqual(['open', 'load', 'load', 'load']);
    expect(steps.timings()).toEqual([
      { step: 'open', ms: 100, attempts: 1, failures: 0 },
      { step: 'load', ms: 4500, attempts: 3, failures: 2, lastError: 'timeout' },
    ]);
    // Each failure logged at debug, the step's first one also at warn.
    expect(log.lines.filter((l) => l.msg === 'start step failed')).toHaveLength(2);
    expect(log.lines.filter((l) => l.level === 'warn')).toHaveLength(1);
  });

  it('ends the start with the error once it may not try again', async () => {
    await Promise.resolve();
    let leading = true;
    const steps = new StartSteps({ log: recordingLog(), retry: () => leading, retryMs: 1 });
    let attempts = 0;
    await expect(
      steps.run('load', async () => {
        await Promise.resolve();
        attempts++;
        if (attempts === 3) leading = false;
        throw new Error('no responders');
      }),
    ).rejects.toThrow('no responders');
    expect(attempts).toBe(3);
  });

  it('without retry a failure ends the start at once', async () => {
    await Promise.resolve();
    const steps = new StartSteps({ log: recordingLog() });
    let attempts = 0;
    await expect(
      steps.run('load', async () => {
        await Promise.resolve();
        attempts++;
        throw new Error('timeout');
      }),
    ).rejects.toThrow('timeout');
    expect(attempts).toBe(1);
  });

  it('reports the start once it serves: one info line and the gauges', async () => {
    await Promise.resolve();
    let now = 1000;
    const log = recordingLog();
    const registry = new Registry();
    const steps = new StartSteps({ log, registry, retry: () => true, retryMs: 1, now: () => now });
    now = 5000;
    steps.begin();
    await steps.run('policies_bucket', async () => {
      await Promise.resolve();
      now += 250;
    });
    let failed = false;
    await steps.run('allocations_keys', async () => {
      await Promise.resolve();
      now += 1500;
      if (!failed) {
        failed = true;
        throw new Error('timeout');
      }
    });
    now += 50;
    steps.done({ epoch: 2 });
    const line = log.lines.find((l) => l.msg === 'coordinator serving');
    expect(line?.obj).toEqual({
      epoch: 2,
      startMs: 3300,
      steps: { policies_bucket: 250, allocations_keys: 3000 },
      failed: { allocations_keys: 1 },
    });
    const metrics = await registry.getMetricsAsJSON();
    const value = (name: string, step?: string) =>
      metrics
        .find((m) => m.name === name)
        ?.values.find((v) => step === undefined || v.labels['step'] === step)?.value;
    expect(value('qp_coord_start_seconds')).toBe(3.3);
    expect(value('qp_coord_start_step_seconds', 'allocations_keys')).toBe(3);
    expect(value('qp_coord_start_step_failures', 'allocations_keys')).toBe(1);
    expect(value('qp_coord_start_step_failures', 'policies_bucket')).toBe(0);
  });
});
