/**
 * The record of an instance's terms (regional-agent/terms/terms-until.ts): every term's end written before it is
 * answered, writes shared by the requests that arrive meanwhile, and how long a successor waits for it at start.
 */
import { describe, expect, it } from 'vitest';
import {
  predecessorTermsOver,
  TermsUntil,
  UNREAD_WAIT_MS,
  waitForRecordMs,
  type TermsUntilRecord,
} from '../../../../regional-agent/terms/terms-until.js';

/** A store whose writes wait until the test settles them, in order. */
function pendingStore() {
  const writes: { until: number; ok: () => void; fail: (e: Error) => void }[] = [];
  const store = {
    write: (until: number) =>
      new Promise<void>((ok, fail) => {
        writes.push({ until, ok, fail });
      }),
  };
  return { store, writes };
}

const flush = () => new Promise((r) => setTimeout(r, 0));

/** Whether each promise settled yet, and how. */
function track(p: Promise<void>) {
  const state = { settled: 'no' as 'no' | 'ok' | 'failed' };
  p.then(
    () => (state.settled = 'ok'),
    () => (state.settled = 'failed'),
  );
  return state;
}

describe('TermsUntil: each term recorded before it is answered', () => {
  it('resolves only once the write covering it returned; an instant already written needs no write', async () => {
    const { store, writes } = pendingStore();
    const until = new TermsUntil(store);
    const first = track(until.cover(1_000));
    await flush();
    expect(writes.map((w) => w.until)).toEqual([1_000]);
    expect(first.settled).toBe('no');
    writes[0]!.ok();
    await flush();
    expect(first.settled).toBe('ok');
    // Earlier or equal: covered by what Redis holds already.
    await until.cover(900);
    await until.cover(1_000);
    expect(writes).toHaveLength(1);
  });

  it('requests during a write share the next one, of the latest instant among them', async () => {
    const { store, writes } = pendingStore();
    const until = new TermsUntil(store);
    const a = track(until.cover(1_000));
    await flush();
    const earlier = track(until.cover(800));
    const b = track(until.cover(1_500));
    const c = track(until.cover(1_200));
    await flush();
    expect(writes.map((w) => w.until)).toEqual([1_000]);
    writes[0]!.ok();
    await flush();
    // The earlier one was covered by the first write; the later two wait for the next, one write of 1500.
    expect([a.settled, earlier.settled, b.settled, c.settled]).toEqual(['ok', 'ok', 'no', 'no']);
    expect(writes.map((w) => w.until)).toEqual([1_000, 1_500]);
    writes[1]!.ok();
    await flush();
    expect([b.settled, c.settled]).toEqual(['ok', 'ok']);
    expect(writes).toHaveLength(2);
  });

  it('a failed write fails the terms it would have covered; those queued behind it get a write of their own', async () => {
    const { store, writes } = pendingStore();
    const until = new TermsUntil(store);
    const a = track(until.cover(1_000));
    await flush();
    const same = track(until.cover(1_000));
    const later = track(until.cover(2_000));
    writes[0]!.fail(new Error('READONLY'));
    await flush();
    expect([a.settled, same.settled, later.settled]).toEqual(['failed', 'failed', 'no']);
    expect(writes.map((w) => w.until)).toEqual([1_000, 2_000]);
    writes[1]!.ok();
    await flush();
    expect(later.settled).toBe('ok');
    // Asked again, the failed instant is covered by 2000 now.
    await until.cover(1_000);
    expect(writes).toHaveLength(2);
  });

  it('a store that throws at once fails the term, never the caller', async () => {
    const until = new TermsUntil({
      write: () => {
        throw new Error('connection is closed');
      },
    });
    await expect(until.cover(1)).rejects.toThrow('connection is closed');
  });
});

describe("the wait at start for a predecessor's terms", () => {
  const NOW = 1_765_000_000_000_000;

  function start(read: () => Promise<TermsUntilRecord>) {
    const slept: number[] = [];
    const logged: { level: string; obj: object; msg?: string | undefined }[] = [];
    const waited: number[] = [];
    const over = predecessorTermsOver({
      store: { read },
      log: {
        info: (obj, msg) => void logged.push({ level: 'info', obj, msg }),
        warn: (obj, msg) => void logged.push({ level: 'warn', obj, msg }),
      },
      sleep: (ms) => {
        slept.push(ms);
        return Promise.resolve();
      },
      onWait: (ms) => void waited.push(ms),
    });
    return { over, slept, logged, waited };
  }

  it('nothing recorded (no term was ever given, or the key expired): no wait at all, nothing logged', async () => {
    const { over, slept, logged, waited } = start(() => Promise.resolve({ untilMicros: 0, nowMicros: NOW }));
    await over;
    expect({ slept, logged, waited }).toEqual({ slept: [], logged: [], waited: [0] });
  });

  it('a record already passed in Redis time: no wait', async () => {
    const { over, slept } = start(() => Promise.resolve({ untilMicros: NOW - 1, nowMicros: NOW }));
    await over;
    expect(slept).toEqual([]);
  });

  it("a predecessor's term still running: waits until Redis time passes it, and the margin; says so", async () => {
    // A predecessor with QP_TERM_MS=2000 recorded 2 s + 20 ms ahead; whatever this agent's own QP_TERM_MS is.
    const { over, slept, logged } = start(() =>
      Promise.resolve({ untilMicros: NOW + 2_020_000, nowMicros: NOW }),
    );
    await over;
    expect(slept).toEqual([2_040]);
    expect(logged).toEqual([
      {
        level: 'info',
        obj: { waitMs: 2_040, untilMicros: NOW + 2_020_000 },
        msg: "waiting 2040 ms for a predecessor's terms before the first heartbeat and acknowledgement",
      },
    ]);
  });

  it('part of a millisecond left still waits a whole one (and the margin)', () => {
    expect(waitForRecordMs({ untilMicros: NOW + 1, nowMicros: NOW })).toBe(21);
  });

  it('the read failing (Redis down at start): waits the longest term any predecessor could give, and warns', async () => {
    const { over, slept, logged } = start(() => Promise.reject(new Error('Redis not ready within 2000 ms')));
    await over;
    expect(UNREAD_WAIT_MS).toBe(2_020);
    expect(slept).toEqual([UNREAD_WAIT_MS]);
    expect(logged).toMatchObject([{ level: 'warn', obj: { waitMs: UNREAD_WAIT_MS } }]);
  });
});
