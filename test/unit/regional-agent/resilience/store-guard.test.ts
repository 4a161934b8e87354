/**
 * Which failures count against the store breaker: only the store's own. A request refused by validation (the one
 * coded InvalidBucketRequestError, for buckets, refunds and sliding logs alike), by the script's argument checks,
 * for spanning slots, or for its caller's deadline never opens it; anything else does, a TypeError included (a
 * reply of the wrong shape is the store's failure, or a bug, never the caller's).
 */
import { trace } from '@opentelemetry/api';
import { describe, expect, it } from 'vitest';
import { ZodError } from 'zod';
import { encodeRequest, InvalidBucketRequestError, parseReply } from '../../../../core/wire/bucket.js';
import { encodeRefund } from '../../../../core/models/refund.js';
import { parseLogRequest } from '../../../../core/models/sliding-log.js';
import { AgentMetrics } from '../../../../regional-agent/observability/metrics.js';
import { CallerDeadlineError } from '../../../../regional-agent/decisions/decision-store.js';
import { CrossSlotError } from '../../../../regional-agent/redis/bucket-store.js';
import { ScriptError } from '../../../../regional-agent/redis/scripts.js';
import {
  isCallerError,
  StoreGuard,
  StoreUnavailableError,
} from '../../../../regional-agent/resilience/store-guard.js';

const caught = (fn: () => unknown): unknown => {
  try {
    fn();
  } catch (error) {
    return error;
  }
  throw new Error('expected a throw');
};

const badCheck = { key: 'rl:v1:{s}:p', capacity: 10, refillPerSecond: 1, cost: 0.0000001, ttlMs: 60_000 };

describe('caller errors and store failures', () => {
  it('every store request refused by validation is the one coded error, whatever the store', () => {
    const errors = [
      caught(() => encodeRequest({ checks: [badCheck] })),
      caught(() => encodeRefund({ checks: [{ key: 'k', cost: -1, capacity: 1 }] })),
      caught(() => parseLogRequest({ checks: [] })),
    ];
    for (const error of errors) {
      expect(error).toBeInstanceOf(InvalidBucketRequestError);
      expect((error as InvalidBucketRequestError).code).toBe('QP_BADARG');
      expect(isCallerError(error)).toBe(true);
    }
  });

  it('classifies exactly the coded caller errors as the caller’s', () => {
    expect(isCallerError(new CallerDeadlineError())).toBe(true);
    expect(isCallerError(new ScriptError('QP_BADARG cost must be >= 1'))).toBe(true);
    expect(isCallerError(new CrossSlotError([1, 2]))).toBe(true);
    // A reply of the wrong shape, any TypeError, a stray ZodError, a connection error: the store's failures.
    expect(isCallerError(caught(() => parseReply([1, 0, 'x'], 1)))).toBe(false);
    expect(isCallerError(new TypeError("Cannot read properties of undefined (reading 'tk')"))).toBe(false);
    expect(isCallerError(new ZodError([]))).toBe(false);
    expect(isCallerError(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }))).toBe(false);
  });

  it('a store bug that throws TypeError opens the breaker; invalid requests never do', async () => {
    const newGuard = () =>
      new StoreGuard(
        { errorPercent: 50, volumeThreshold: 4, resetMs: 60_000, windowMs: 10_000 },
        new AgentMetrics({ region: 'us' }),
        trace.getTracer('test'),
      );
    const callers = newGuard();
    try {
      for (let i = 0; i < 40; i++) {
        await expect(
          callers.run('decide', () => Promise.resolve(encodeRequest({ checks: [badCheck] }))),
        ).rejects.toBeInstanceOf(InvalidBucketRequestError);
      }
      expect(callers.status.state).toBe('closed');
    } finally {
      callers.shutdown();
    }
    const guard = newGuard();
    try {
      for (let i = 0; i < 4; i++) {
        const failure = await guard
          .run('decide', () => Promise.resolve(parseReply(['garbage'], 1)))
          .catch((e: unknown) => e);
        expect(failure).toBeInstanceOf(StoreUnavailableError);
      }
      expect(guard.status.state).toBe('open');
      expect(guard.status.cause?.kind).toBe('error');
      expect(guard.status.cause?.message).toContain('unexpected token bucket reply');
    } finally {
      guard.shutdown();
    }
  });
});

describe('the breaker counts Redis calls, not decisions', () => {
  const newGuard = () =>
    new StoreGuard(
      { errorPercent: 50, volumeThreshold: 4, resetMs: 50, windowMs: 10_000 },
      new AgentMetrics({ region: 'us' }),
      trace.getTracer('test'),
    );
  const timeout = () => Object.assign(new Error('no reply within 50 ms'), { code: 'ETIMEDOUT' });

  it('one failed call carrying 40 decisions is one failure: the breaker stays closed', async () => {
    const guard = newGuard();
    try {
      const shared = timeout();
      const answers = await Promise.all(
        Array.from({ length: 40 }, () =>
          guard.run('decide', () => Promise.reject(shared)).catch((e: unknown) => e),
        ),
      );
      expect(answers.every((a) => a instanceof StoreUnavailableError)).toBe(true);
      expect(guard.status.state).toBe('closed');
      // Three more failed calls make four in the window, all failures: it opens.
      for (let i = 0; i < 3; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('open');
    } finally {
      guard.shutdown();
    }
  });

  it('each told success and failure counts toward the rate: four failed calls of seven open it', async () => {
    const guard = newGuard();
    try {
      // Three successful calls, then four failed ones: 4 of 7 told calls failed (57 % > 50 %), so it opens.
      for (let i = 0; i < 3; i++) await guard.run('decide', () => Promise.resolve({ allowed: true }));
      for (let i = 0; i < 3; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('closed');
      await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('open');
    } finally {
      guard.shutdown();
    }
  });

  it('a frozen Redis opens it after volumeThreshold failed calls in a row, however many good calls came before', async () => {
    const guard = newGuard();
    try {
      for (let i = 0; i < 100; i++) await guard.run('decide', () => Promise.resolve(i));
      // 3 failed of 103 calls: far under 50 %, and 3 in a row.
      for (let i = 0; i < 3; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('closed');
      // One good call starts the count again.
      await guard.run('decide', () => Promise.resolve(0));
      for (let i = 0; i < 3; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('closed');
      await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('open');
      expect(guard.status.cause?.kind).toBe('error');
    } finally {
      guard.shutdown();
    }
  });

  it('half-open: a trial the script refused for its arguments closes it (Redis answered)', async () => {
    const guard = newGuard();
    try {
      for (let i = 0; i < 4; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      await new Promise((r) => setTimeout(r, 80));
      expect(guard.status.state).toBe('half_open');
      await expect(
        guard.run('decide', () => Promise.reject(new ScriptError('QP_BADARG cost must be >= 1'))),
      ).rejects.toBeInstanceOf(ScriptError);
      expect(guard.status.state).toBe('closed');
    } finally {
      guard.shutdown();
    }
  });

  it('open: decisions fail at once without calling the store; half-open: one trial, then closed on its success', async () => {
    const guard = newGuard();
    try {
      for (let i = 0; i < 4; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      expect(guard.status.state).toBe('open');
      let calls = 0;
      const store = () => {
        calls++;
        return new Promise((r) => setTimeout(() => r({ allowed: true }), 20));
      };
      const open = await guard.run('decide', store).catch((e: unknown) => e);
      expect(open).toMatchObject({ kind: 'circuit_open' });
      expect(calls).toBe(0);
      await new Promise((r) => setTimeout(r, 80));
      expect(guard.status.state).toBe('half_open');
      const [trial, other] = await Promise.all([
        guard.run('decide', store),
        guard.run('decide', store).catch((e: unknown) => e),
      ]);
      expect(trial).toEqual({ allowed: true });
      expect(other).toMatchObject({ kind: 'circuit_open' });
      expect(calls).toBe(1);
      expect(guard.status.state).toBe('closed');
    } finally {
      guard.shutdown();
    }
  });

  it('half-open: a trial ended by the caller’s own error hands the trial to the next decision', async () => {
    const guard = newGuard();
    try {
      for (let i = 0; i < 4; i++) await guard.run('decide', () => Promise.reject(timeout())).catch(() => 0);
      await new Promise((r) => setTimeout(r, 80));
      expect(guard.status.state).toBe('half_open');
      await expect(
        guard.run('decide', () => Promise.reject(new CallerDeadlineError())),
      ).rejects.toBeInstanceOf(CallerDeadlineError);
      expect(guard.status.state).toBe('half_open');
      await expect(guard.run('decide', () => Promise.resolve(1))).resolves.toBe(1);
      expect(guard.status.state).toBe('closed');
    } finally {
      guard.shutdown();
    }
  });
});
