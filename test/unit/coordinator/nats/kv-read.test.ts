/**
 * Opening and reading a KV bucket for a coordinator's start (coordinator/nats/kv-read.ts): an existing bucket costs
 * one request (a stream info with its subject index, which the stream leader answers), nothing that goes through
 * JetStream's meta leader unless the bucket must be created or scaled; the values are a step of their own, tried
 * again alone; and the policy store takes what was read instead of listing the bucket through a consumer.
 */
import { JetStreamApiError, type JetStreamManager, type StreamInfo } from '@nats-io/jetstream';
import type { KV, KvEntry, Kvm } from '@nats-io/kv';
import { describe, expect, it } from 'vitest';
import { systemClock } from '../../../../core/clock.js';
import { CoordinatorMetrics } from '../../../../coordinator/metrics.js';
import { latestEntries, openAndRead, openBucket } from '../../../../coordinator/nats/kv-read.js';
import { KvPolicyStore } from '../../../../coordinator/policies/kv-policy-store.js';
import type { Logger } from '../../../../coordinator/ports.js';
import { StartSteps, type Step } from '../../../../coordinator/start-steps.js';

const silent: Logger = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {} };

function entry(key: string, revision: number, value: unknown, operation = 'PUT'): KvEntry {
  const text = operation === 'PUT' ? JSON.stringify(value) : '';
  return {
    bucket: 'b',
    key,
    revision,
    operation,
    created: new Date(0),
    delta: 0,
    length: text.length,
    value: new TextEncoder().encode(text),
    string: () => text,
    json: <T>() => JSON.parse(text) as T,
  } as KvEntry;
}

/** A JetStream double that records every request it is asked. */
function fakeJetStream(options: {
  exists?: boolean;
  replicas?: number;
  subjects?: Record<string, number>;
  values?: Record<string, KvEntry | null>;
  /** Value reads that fail before one succeeds. */
  getFailures?: number;
}) {
  const calls: string[] = [];
  let exists = options.exists ?? true;
  let getFailures = options.getFailures ?? 0;
  const info = (name: string, subjects: Record<string, number>): StreamInfo =>
    ({
      config: { name, num_replicas: options.replicas ?? 3, allow_direct: true, subjects: ['$KV.b.>'] },
      state: { subjects },
    }) as unknown as StreamInfo;
  const jsm = {
    streams: {
      info: (name: string, data?: { subjects_filter?: string }) => {
        calls.push(`info ${name} ${data?.subjects_filter ?? ''}`.trim());
        if (!exists) {
          return Promise.reject(
            new JetStreamApiError({ code: 404, err_code: 10059, description: 'stream not found' }),
          );
        }
        return Promise.resolve(
          info(name, data?.subjects_filter === undefined ? {} : (options.subjects ?? {})),
        );
      },
      update: (name: string, config: { num_replicas: number }) => {
        calls.push(`update ${name} replicas=${config.num_replicas}`);
        return Promise.resolve(info(name, {}));
      },
    },
  } as unknown as JetStreamManager;
  const view = (how: string): KV =>
    ({
      how,
      get: (key: string) => {
        calls.push(`get ${key} via ${how}`);
        if (getFailures > 0) {
          getFailures--;
          return Promise.reject(new Error('JetStream system temporarily unavailable'));
        }
        return Promise.resolve(options.values?.[key] ?? null);
      },
    }) as unknown as KV;
  const kvm = {
    create: (bucket: string, o: { replicas?: number }) => {
      calls.push(`create ${bucket} replicas=${o.replicas}`);
      exists = true;
      return Promise.resolve(view('create'));
    },
    open: (bucket: string, o?: { allow_direct?: boolean }) => {
      calls.push(`open ${bucket}${o?.allow_direct === true ? ' direct' : ''}`);
      return Promise.resolve(view(o?.allow_direct === true ? 'direct' : 'leader'));
    },
  } as unknown as Kvm;
  return { calls, jsm, kvm };
}

describe('openBucket', () => {
  it('opens an existing bucket with one stream info (its subject index), binding without a request', async () => {
    const js = fakeJetStream({ subjects: { '$KV.b.p1': 1, '$KV.b.p2': 3 } });
    const opened = await openBucket(js.kvm, js.jsm, 'b', { history: 1, replicas: 3 });
    expect(opened.keys).toEqual(['p1', 'p2']);
    // Writes as Kvm.create would open it (direct gets where the stream allows them), reads through the leader.
    expect((opened.kv as unknown as { how: string }).how).toBe('direct');
    expect((opened.reader as unknown as { how: string }).how).toBe('leader');
    expect(js.calls).toEqual(['info KV_b $KV.b.>', 'open b direct', 'open b']);
  });

  it('scales a bucket of another replica count, and creates one that does not exist', async () => {
    const scaled = fakeJetStream({ replicas: 1, subjects: { '$KV.b.p1': 1 } });
    await openBucket(scaled.kvm, scaled.jsm, 'b', { replicas: 3 });
    expect(scaled.calls).toContain('update KV_b replicas=3');

    const missing = fakeJetStream({ exists: false });
    const opened = await openBucket(missing.kvm, missing.jsm, 'b', { replicas: 3 });
    expect(opened.keys).toEqual([]);
    expect(missing.calls.slice(0, 2)).toEqual(['info KV_b $KV.b.>', 'create b replicas=3']);
  });

  it('passes on any other failure (a stream leader still being elected) for the step to try again', async () => {
    const js = fakeJetStream({});
    js.jsm.streams.info = () => Promise.reject(new Error('JetStream system temporarily unavailable'));
    await expect(openBucket(js.kvm, js.jsm, 'b', { replicas: 3 })).rejects.toThrow('temporarily unavailable');
  });
});

describe('openAndRead', () => {
  const read = (js: ReturnType<typeof fakeJetStream>, step?: Step) =>
    openAndRead({ kvm: js.kvm, jsm: js.jsm, bucket: 'b', settings: { replicas: 3 }, what: 'things', step });

  it('tries a failed read of the values again on its own: the bucket is opened once', async () => {
    const js = fakeJetStream({
      subjects: { '$KV.b.p1': 1, '$KV.b.gone': 2 },
      values: { p1: entry('p1', 1, { a: 1 }), gone: entry('gone', 2, null, 'DEL') },
      getFailures: 3,
    });
    const steps = new StartSteps({ log: silent, retry: () => true, retryMs: 0 });
    const { entries } = await read(js, (name, call) => steps.run(name, call));
    expect(entries.map((e) => [e.key, e.operation])).toEqual([
      ['p1', 'PUT'],
      ['gone', 'DEL'],
    ]);
    expect(js.calls.filter((c) => c.startsWith('info'))).toHaveLength(1);
    expect(js.calls.filter((c) => c.startsWith('get')).every((c) => c.endsWith('via leader'))).toBe(true);
    expect(steps.timings().map((t) => [t.step, t.attempts])).toEqual([
      ['things_bucket', 1],
      ['things_values', 3],
    ]);
  });

  it('drops keys with nothing left (purged since the subject index was read)', async () => {
    const js = fakeJetStream({ subjects: { '$KV.b.a': 1 }, values: { a: null } });
    expect(await latestEntries(await js.kvm.open('b'), ['a'])).toEqual([null]);
    expect((await read(js)).entries).toEqual([]);
  });
});

describe('KvPolicyStore.init with the entries read', () => {
  it('counts and hands on what was read, without listing the bucket', async () => {
    const policy = { name: 'p', capacity: 100, refillPerSecond: 10 };
    const noListing = () => Promise.reject(new Error('listed the bucket'));
    const store = new KvPolicyStore({
      kv: { status: noListing, get: noListing } as unknown as KV,
      js: { consumers: { get: noListing } } as never,
      bucket: 'b',
      audit: { record: () => Promise.resolve() } as never,
      regions: ['us', 'eu'],
      maxPolicies: 10,
      clock: systemClock,
      metrics: new CoordinatorMetrics(),
      log: silent,
    });
    await store.init([entry('p', 4, policy), entry('q', 6, null, 'DEL')]);
    const opened = store.takeOpened();
    expect(opened?.map((s) => [s.policy.name, s.revision])).toEqual([['p', 4]]);
    expect(store.takeOpened()).toBeUndefined();
  });
});
