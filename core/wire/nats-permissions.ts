/**
 * Who may publish and subscribe to what on NATS, per role, for one namespace: the table the server's
 * configuration is generated from (coordinator/nats/credentials.ts), so the server itself refuses a forged message.
 *
 * Roles: the coordinator; the agents of one region. Every message subject is one row below, with the side that
 * publishes and the side that reads it; every JetStream bucket or stream is one row with its writer and readers.
 * A new subject is one more row. Requests are answered through the requester's own inbox prefix (no role can
 * read another's replies) and responders answer with `allow_responses` (a reply only to a request received).
 */
import { KvNamespace, kvNames } from './kv.js';
import { protocolSubjects } from './protocol.js';
import { loanSubject } from './loan.js';
import { strictSubject } from './strict.js';

/**
 * How a message subject is scoped by region:
 * - `from-region`: an agent publishes on its own region's subject only; the coordinator reads every region's.
 * - `to-region`: any agent publishes to any region's subject (a request to that region); only the agents of
 *   that region read it.
 */
export type SubjectScope = 'from-region' | 'to-region';

export interface MessageSubjectRule {
  readonly name: string;
  readonly scope: SubjectScope;
  /** The subject of one region. */
  readonly subject: (namespace: string, region: string) => string;
}

/** Every message subject of the protocol, one line each. */
export const MESSAGE_SUBJECTS: readonly MessageSubjectRule[] = [
  { name: 'heartbeat', scope: 'from-region', subject: (ns, r) => protocolSubjects(ns).heartbeat(r) },
  { name: 'usage', scope: 'from-region', subject: (ns, r) => protocolSubjects(ns).usage(r) },
  { name: 'ack', scope: 'from-region', subject: (ns, r) => protocolSubjects(ns).ack(r) },
  { name: 'bye', scope: 'from-region', subject: (ns, r) => protocolSubjects(ns).bye(r) },
  { name: 'strict', scope: 'to-region', subject: (ns, r) => strictSubject(ns, r).subject },
  { name: 'loan', scope: 'to-region', subject: (ns, r) => loanSubject(ns, r).subject },
];

/** A JetStream stream: the coordinator owns it; `agentsRead` lets every agent watch and read it. */
export interface StreamRule {
  readonly name: string;
  /** The stream's name on the server (a KV bucket `b` is the stream `KV_b`). */
  readonly stream: (namespace: string) => string;
  /** Subjects the stream captures: publishing there is writing to it, and a reader's consumer filters on them. */
  readonly subjects: (namespace: string) => string;
  readonly agentsRead: boolean;
}

const bucket = (name: (ns: string) => string): Pick<StreamRule, 'stream' | 'subjects'> => ({
  stream: (ns) => `KV_${name(ns)}`,
  subjects: (ns) => `$KV.${name(ns)}.>`,
});

/** Every stream of the namespace, one line each. */
export const STREAMS: readonly StreamRule[] = [
  { name: 'policies', ...bucket((ns) => kvNames(ns).policies), agentsRead: true },
  { name: 'allocations', ...bucket((ns) => kvNames(ns).allocations), agentsRead: true },
  { name: 'agents', ...bucket((ns) => kvNames(ns).agents), agentsRead: false },
  { name: 'demand', ...bucket((ns) => kvNames(ns).demand), agentsRead: false },
  { name: 'leader', ...bucket((ns) => kvNames(ns).leader), agentsRead: false },
  {
    name: 'audit',
    stream: (ns) => kvNames(ns).auditStream,
    subjects: (ns) => `${kvNames(ns).auditSubjectPrefix}.>`,
    agentsRead: false,
  },
];

/** Subject permissions of one NATS user, in nats-server's configuration shape. */
export interface NatsPermissions {
  readonly publish: { readonly allow: readonly string[] };
  readonly subscribe: { readonly allow: readonly string[] };
  /** Publish to the reply subject of a request this user received (one reply each, within a minute). */
  readonly allow_responses: { readonly max: number; readonly expires: string };
}

/**
 * A process's role. An agent's `tag` (core/wire/protocol.ts `credentialTag`, from its nkey) is the last token of
 * every subject it publishes on, so its messages name their credential and no agent can speak for another's id;
 * without one it publishes on its region's untagged subjects (servers configured before tags).
 */
export type NatsRole = { kind: 'coordinator' } | { kind: 'agent'; region: string; tag?: string };

/**
 * The inbox prefix of the client whose nkey public key is `publicKey`: its replies arrive under `${prefix}.>`,
 * which only it may read. Derived from the key, so a process needs nothing but its seed.
 */
export function inboxPrefix(publicKey: string): string {
  return `_INBOX_${publicKey.replace(/[^A-Za-z0-9_-]/g, '_')}`;
}

/**
 * JetStream API subjects the reading side of a stream needs: bind (stream info), watch (a named consumer filtered
 * on the stream's own subjects, `CONSUMER.CREATE.<stream>.<name>.<filter>`, the only form the KV client uses with
 * servers from 2.9 on; the legacy unnamed and unfiltered forms are refused), get (direct get). No delete: a reader
 * cannot remove another's consumer. The server cannot look inside the request: such a consumer may still be made
 * durable or push the stream's records to any subject (docs/security.md says what that allows).
 */
function readStream(stream: string, subjects: string): string[] {
  return [
    `$JS.API.STREAM.INFO.${stream}`,
    `$JS.API.CONSUMER.CREATE.${stream}.*.${subjects}`,
    `$JS.API.DIRECT.GET.${stream}`,
    `$JS.API.DIRECT.GET.${stream}.>`,
    `$JS.API.STREAM.MSG.GET.${stream}`,
  ];
}

/** Everything the owner of a stream needs: create, update, read, write, purge, consumers. */
function ownStream(stream: string, subjects: string): string[] {
  return [
    `$JS.API.STREAM.*.${stream}`,
    `$JS.API.STREAM.MSG.*.${stream}`,
    `$JS.API.CONSUMER.*.${stream}`,
    `$JS.API.CONSUMER.*.${stream}.>`,
    `$JS.API.CONSUMER.MSG.NEXT.${stream}.>`,
    `$JS.API.DIRECT.GET.${stream}`,
    `$JS.API.DIRECT.GET.${stream}.>`,
    subjects,
  ];
}

/**
 * The permissions of `role` in `namespace`, for a client whose inbox prefix is `inbox` (see `inboxPrefix`).
 * `$JS.API.INFO` (account limits) is open to both: the JetStream client asks it before anything else.
 */
export function natsPermissions(namespace: string, role: NatsRole, inbox: string): NatsPermissions {
  const ns = KvNamespace.parse(namespace);
  const publish = ['$JS.API.INFO'];
  const subscribe = [`${inbox}.>`];
  for (const rule of MESSAGE_SUBJECTS) {
    if (role.kind === 'coordinator') {
      // Every region's, untagged (agents that predate tags) and tagged by the sender's credential.
      if (rule.scope === 'from-region') subscribe.push(rule.subject(ns, '>'));
    } else if (rule.scope === 'from-region') {
      const own = rule.subject(ns, role.region);
      publish.push(role.tag === undefined ? own : `${own}.${role.tag}`);
    } else {
      publish.push(rule.subject(ns, '*'));
      subscribe.push(rule.subject(ns, role.region));
    }
  }
  for (const rule of STREAMS) {
    if (role.kind === 'coordinator') publish.push(...ownStream(rule.stream(ns), rule.subjects(ns)));
    else if (rule.agentsRead) publish.push(...readStream(rule.stream(ns), rule.subjects(ns)));
  }
  return {
    publish: { allow: publish },
    subscribe: { allow: subscribe },
    allow_responses: { max: 1, expires: '1m' },
  };
}
