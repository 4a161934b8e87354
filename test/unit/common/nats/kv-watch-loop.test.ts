/**
 * The KV watch loop's initial load (common/nats/kv-watch-loop.ts): complete at the first entry at or past the
 * bucket's last sequence (read before the watch), never earlier on a pending count or the library's count; given up
 * and tried again when it stalls, so a watch that never finishes its load cannot keep an agent unready forever.
 */
import type { KvWatchEntry } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/nats-core';
import { afterEach, describe, expect, it } from 'vitest';
import { InitialLoadStalled, KvWatchLoop, type OpenedWatch } from '../../../../common/nats/kv-watch-loop.js';
import { eventually } from '../../../helpers/wait.js';

function entry(key: string, revision: number, delta: number, isUpdate: boolean): KvWatchEntry {
  return { key, revision, delta, isUpdate, operation: 'PUT' } as KvWatchEntry;
}

/** A watch double: yields the given entries, then waits (as a live watch does) until stopped. */
function watchOf(entries: KvWatchEntry[]): OpenedWatch['watch'] & { stopped: boolean } {
  let stop!: () => void;
  const stopped = new Promise<void>((resolve) => (stop = resolve));
  const watch = {
    stopped: false,
    stop(): void {
      watch.stopped = true;
      stop();
    },
    async *[Symbol.asyncIterator](): AsyncGenerator<KvWatchEntry> {
      for (const e of entries) {
        if (watch.stopped) return;
        yield e;
      }
      await stopped;
    },
  };
  return watch;
}

/** The connection's status stream only: the loop follows it for reconnects. */
const nc = {
  status: () => ({ stop: () => {}, [Symbol.asyncIterator]: () => ({ next: () => new Promise(() => {}) }) }),
} as unknown as NatsConnection;

const loops: KvWatchLoop[] = [];
afterEach(async () => {
  await Promise.all(loops.splice(0).map((l) => l.close()));
});

function loop(opens: OpenedWatch[], stallMs = 100) {
  const loaded: number[] = [];
  const seen: string[] = [];
  const failures: unknown[] = [];
  let attempt = 0;
  const l = new KvWatchLoop({
    nc,
    bucket: 'allocations',
    timeoutMs: 50,
    retryMs: 10,
    maxRetryMs: 10,
    stallMs,
    open: () => {
      const next = opens[Math.min(attempt, opens.length - 1)]!;
      attempt += 1;
      return Promise.resolve(next);
    },
    session: () => ({
      loaded: (revision) => loaded.push(revision),
      entry: (e, initial) => seen.push(`${e.key}@${String(e.revision)}${initial ? ' initial' : ''}`),
    }),
    onFailure: (error) => failures.push(error),
  });
  loops.push(l);
  return { l, loaded, seen, failures, attempts: () => attempt };
}

describe('KvWatchLoop initial load', () => {
  it("completes at the entry at the bucket's last sequence", async () => {
    const { loaded, seen, failures } = loop([
      { values: 2, lastSeq: 5, watch: watchOf([entry('a', 3, 1, false), entry('b', 5, 0, false)]) },
    ]);
    await eventually(() => loaded.length > 0, 2000, 'the load completes');
    expect(loaded).toEqual([5]);
    expect(seen).toEqual(['a@3 initial', 'b@5 initial']);
    expect(failures).toEqual([]);
  });

  it('is not complete before the last sequence, whatever the pending count or the library count say', async () => {
    // A consumer recreated mid-load counts every revision after its cursor towards the library's count, and a
    // pending count reads zero between two writes: neither means every key's latest value has come.
    const { l, loaded, seen, failures } = loop([
      {
        values: 3,
        lastSeq: 9,
        watch: watchOf([
          entry('a', 4, 0, false),
          entry('b', 6, 1, true),
          entry('c', 9, 0, true),
          entry('a', 10, 0, true),
        ]),
      },
    ]);
    await eventually(() => loaded.length > 0, 2000, 'the load completes');
    expect(loaded).toEqual([9]);
    expect(seen).toEqual(['a@4 initial', 'b@6 initial', 'c@9 initial', 'a@10']);
    expect(failures).toEqual([]);
    expect(l.describe()).toBe('1 loads of allocations completed');
  });

  it('completes at a later entry when the one at the last sequence was removed meanwhile', async () => {
    const { loaded, seen } = loop([
      { values: 2, lastSeq: 8, watch: watchOf([entry('a', 3, 0, true), entry('b', 11, 0, true)]) },
    ]);
    await eventually(() => loaded.length > 0, 2000, 'the load completes');
    expect(loaded).toEqual([11]);
    expect(seen).toEqual(['a@3 initial', 'b@11 initial']);
  });

  it('an empty bucket is loaded at once', async () => {
    const { loaded } = loop([{ values: 0, lastSeq: 12, watch: watchOf([]) }]);
    await eventually(() => loaded.length > 0, 2000, 'the load completes');
    expect(loaded).toEqual([12]);
  });

  it('gives up a load that stalls, says so, and completes on the next watch', async () => {
    // Pending zero and the library's count reached, yet the entry at the last sequence never comes.
    const stuck = watchOf([entry('a', 3, 0, true)]);
    const { l, loaded, seen, failures, attempts } = loop([
      { values: 2, lastSeq: 5, watch: stuck },
      { values: 2, lastSeq: 5, watch: watchOf([entry('a', 3, 1, false), entry('b', 5, 0, false)]) },
    ]);
    await eventually(() => loaded.length > 0, 2000, 'the second load completes');
    expect(loaded).toEqual([5]);
    expect(stuck.stopped).toBe(true);
    expect(attempts()).toBe(2);
    expect(failures).toHaveLength(1);
    expect(failures[0]).toBeInstanceOf(InitialLoadStalled);
    expect((failures[0] as Error).message).toBe(
      'the initial load of allocations stalled: 1 entries of about 2 in, none for 100 ms; watching again',
    );
    // The second session saw the whole load again: the first one's entries are not carried over.
    expect(seen).toEqual(['a@3 initial', 'a@3 initial', 'b@5 initial']);
    expect(l.describe()).toMatch(
      /^1 loads of allocations completed, 1 stalled, last failure: the initial load/,
    );
  });

  it('says how far a load in progress has come', async () => {
    const { l, loaded } = loop(
      [{ values: 4, lastSeq: 5, watch: watchOf([entry('a', 3, 3, false)]) }],
      60_000,
    );
    await eventually(() => l.describe().startsWith('loading'), 2000, 'the load starts');
    expect(l.describe()).toMatch(/^loading allocations for \d+ ms: 1 entries of about 4, 0 loads completed$/);
    expect(loaded).toEqual([]);
  });
});
