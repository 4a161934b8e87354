/**
 * The audit trail as a JetStream stream: one subject per policy (`<ns>.audit.<policy key>`), bounded by count,
 * bytes and age (oldest records go first). Each record carries a message id made of its policy and KV
 * revision, so a retried append is stored once.
 */
import type { JetStreamClient, JetStreamManager, StreamConfig } from '@nats-io/jetstream';
import { DiscardPolicy, RetentionPolicy, StorageType } from '@nats-io/jetstream';
import { nanos } from '@nats-io/nats-core';
import type { AuditEntry, AuditQuery, AuditRecord, AuditResponse } from '../../core/wire/admin.js';
import { AuditRecord as AuditRecordSchema } from '../../core/wire/admin.js';
import { auditSubject, type KvNames } from '../../core/wire/kv.js';
import type { CoordinatorMetrics } from '../metrics.js';
import type { Logger } from '../ports.js';
import type { AuditTrail } from './audit-trail.js';

/** Bounds of the audit stream. */
export interface AuditLimits {
  readonly maxRecords: number;
  readonly maxAgeDays: number;
  readonly maxBytes: number;
}

const FETCH_BATCH = 256;

/** Create the audit stream, or bring an existing one's limits in line with `limits`. */
export async function ensureAuditStream(
  jsm: JetStreamManager,
  names: KvNames,
  limits: AuditLimits,
  replicas = 1,
): Promise<void> {
  const wanted: Partial<StreamConfig> = {
    num_replicas: replicas,
    max_msgs: limits.maxRecords,
    max_bytes: limits.maxBytes,
    max_age: nanos(limits.maxAgeDays * 24 * 3600 * 1000),
    discard: DiscardPolicy.Old,
  };
  try {
    const info = await jsm.streams.info(names.auditStream);
    const c = info.config;
    if (
      c.max_msgs !== wanted.max_msgs ||
      c.max_bytes !== wanted.max_bytes ||
      c.max_age !== wanted.max_age ||
      c.num_replicas !== wanted.num_replicas
    ) {
      await jsm.streams.update(names.auditStream, { ...c, ...wanted });
    }
  } catch (error) {
    if (!(error instanceof Error) || !/stream not found/i.test(error.message)) throw error;
    await jsm.streams.add({
      name: names.auditStream,
      subjects: [`${names.auditSubjectPrefix}.>`],
      storage: StorageType.File,
      retention: RetentionPolicy.Limits,
      description: 'quotaplane policy audit trail',
      ...wanted,
    });
  }
}

export class JetStreamAuditTrail implements AuditTrail {
  readonly #js: JetStreamClient;
  readonly #jsm: JetStreamManager;
  readonly #names: KvNames;
  readonly #metrics: CoordinatorMetrics;
  readonly #log: Logger;

  constructor(deps: {
    js: JetStreamClient;
    jsm: JetStreamManager;
    names: KvNames;
    metrics: CoordinatorMetrics;
    log: Logger;
  }) {
    this.#js = deps.js;
    this.#jsm = deps.jsm;
    this.#names = deps.names;
    this.#metrics = deps.metrics;
    this.#log = deps.log;
  }

  async record(record: AuditRecord, options: { imported?: boolean } = {}): Promise<void> {
    // Refusals name no policy (or one that may not exist): they go to a subject of their own, which no policy
    // key can be (policy names start with a-z or 0-9).
    const subject =
      record.policy === undefined || record.action === 'refused'
        ? `${this.#names.auditSubjectPrefix}._refused`
        : auditSubject(this.#names, record.policy);
    // The stream drops a message whose id it saw in its duplicate window: an imported record's id is its own, or
    // the restore's fresh writes (the same policy at the same revision) would be taken for duplicates of it.
    const id = options.imported === true ? `import:${record.at}:${messageId(record)}` : messageId(record);
    await this.#js.publish(subject, JSON.stringify(record), { msgID: id });
  }

  async read(query: AuditQuery): Promise<AuditResponse> {
    const info = await this.#jsm.streams.info(this.#names.auditStream);
    const { first_seq: first, last_seq: last, messages } = info.state;
    const end = Math.min(last, (query.before ?? Number.MAX_SAFE_INTEGER) - 1);
    if (messages === 0 || end < first) return { entries: [], next: null };
    // Without a policy filter the stream is dense between first and last (limits drop only the oldest), so
    // the page starts exactly `limit` back. With one, or with moves hidden, scan and keep the last `limit`.
    const hide = query.moves === 'hide';
    const dense = query.policy === undefined && !hide;
    const start = dense ? Math.max(first, end - query.limit + 1) : first;
    const subject =
      query.policy === undefined
        ? `${this.#names.auditSubjectPrefix}.>`
        : auditSubject(this.#names, query.policy);
    const page: AuditEntry[] = [];
    // With moves hidden: how many were seen in all, and how many before each kept entry, to count those in range.
    let moves = 0;
    const movesBefore: number[] = [];
    let dropped = false;
    const consumer = await this.#js.consumers.get(this.#names.auditStream, {
      filter_subjects: subject,
      opt_start_seq: start,
      inactive_threshold: 30_000,
    });
    let done = false;
    while (!done) {
      const batch = await consumer.fetch({ max_messages: FETCH_BATCH, expires: 2000 });
      let got = 0;
      for await (const m of batch) {
        got++;
        if (m.seq > end) {
          done = true;
          break;
        }
        const parsed = AuditRecordSchema.safeParse(safeJson(m.string()));
        if (parsed.success && hide && parsed.data.action === 'move') {
          moves++;
        } else if (parsed.success) {
          page.push({ ...parsed.data, seq: m.seq });
          movesBefore.push(moves);
          if (page.length > query.limit) {
            page.shift();
            movesBefore.shift();
            dropped = true;
          }
        } else {
          this.#metrics.badEntries.inc({ where: 'audit' });
          this.#log.warn(
            { seq: m.seq, issues: parsed.error.issues.length },
            'skipped an invalid audit record',
          );
        }
        if (m.info.pending === 0 || m.seq === end) {
          done = true;
          break;
        }
      }
      if (got === 0) done = true;
    }
    await consumer.delete().catch(() => undefined);
    page.reverse();
    const oldest = page.at(-1)?.seq;
    const more = dense ? start > first : dropped;
    const next = more ? (oldest ?? start) : null;
    if (!hide) return { entries: page, next };
    // The moves within the page: after its oldest entry, or all of them when the page reaches the start.
    const movesHidden = moves - (more ? (movesBefore[0] ?? 0) : 0);
    return { entries: page, next, movesHidden };
  }
}

/**
 * The stream's deduplication id: a retried append is stored once. Moves carry allocation revisions and restores
 * the revision of a foreign entry in either bucket, other sequences than policy ETags, so their ids must not
 * collide; a refusal is one window of one source and reason.
 */
function messageId(record: AuditRecord): string {
  switch (record.action) {
    case 'move':
      return `move:${record.policy ?? ''}:${record.revision ?? 0}`;
    case 'restore':
      return `restore:${record.restored?.bucket ?? ''}:${record.revision ?? 0}`;
    case 'refused':
      return `refused:${record.at}:${record.source ?? ''}:${record.refused?.reason ?? ''}`;
    default:
      return `${record.policy ?? ''}:${record.revision ?? 0}`;
  }
}

function safeJson(s: string): unknown {
  try {
    return JSON.parse(s) as unknown;
  } catch {
    return undefined;
  }
}
