/**
 * Names in NATS JetStream shared by the coordinator (which writes policies) and the agents (which watch them):
 * bucket and stream names derived from one namespace, and the rule that turns a policy name into a KV key.
 */
import { z } from 'zod';
import { PolicyName } from '../policy/policy.js';

/**
 * Prefix of every JetStream bucket, stream and subject one deployment uses, so several deployments (or test
 * runs) can share a NATS account: 1-32 chars of `a-z 0-9 -`, starting with a letter.
 */
export const KvNamespace = z
  .string()
  .regex(/^[a-z][a-z0-9-]{0,31}$/, 'namespaces are 1-32 chars of a-z 0-9 - starting with a-z');
export type KvNamespace = z.infer<typeof KvNamespace>;

/** The namespace used when none is configured. */
export const DEFAULT_KV_NAMESPACE = 'qp';
/** Deadline of one NATS request or JetStream call by default, ms (coordinator and agents alike). */
export const DEFAULT_NATS_TIMEOUT_MS = 2000;

/** Every JetStream name of one namespace. */
export interface KvNames {
  /** KV bucket of policies: key = `policyKey(name)`, value = the stored policy JSON (validated by `Policy`). */
  readonly policies: string;
  /** KV bucket of allocation records (core/wire/protocol.ts AllocationRecord): key = `policyKey(name)`. */
  readonly allocations: string;
  /** KV bucket of the agents the coordinator knows (AgentRegistration), so a restart remembers who may hold a lease. */
  readonly agents: string;
  /** KV bucket of the leader's demand snapshots (core/lease/demand-snapshot.ts): key = `policyKey(name)`. */
  readonly demand: string;
  /** KV bucket of the coordinators' leader lease (coordinator/leadership): one key, the holder and its epoch. */
  readonly leader: string;
  /** Stream of audit records, one subject per policy. */
  readonly auditStream: string;
  /** Subject prefix of the audit stream; a record about policy P goes to `${auditSubjectPrefix}.${policyKey(P)}`. */
  readonly auditSubjectPrefix: string;
}

/** The bucket, stream and subject names of `namespace`. */
export function kvNames(namespace: string = DEFAULT_KV_NAMESPACE): KvNames {
  const ns = KvNamespace.parse(namespace);
  return {
    policies: `${ns}-policies`,
    allocations: `${ns}-allocations`,
    agents: `${ns}-agents`,
    demand: `${ns}-demand`,
    leader: `${ns}-leader`,
    auditStream: `${ns}-audit`,
    auditSubjectPrefix: `${ns}.audit`,
  };
}

/**
 * The KV key of a policy. Policy names may hold `.`, which NATS reads as a token separator (and refuses at
 * either end or doubled), so every `.` becomes `=`, a character policy names never contain: the mapping is
 * one-to-one and every key is a single token.
 */
export function policyKey(name: string): string {
  return name.replaceAll('.', '=');
}

/** The policy name a KV key stands for, or `undefined` when the key could not have come from `policyKey`. */
export function policyNameFromKey(key: string): string | undefined {
  if (key.includes('.')) return undefined;
  const name = key.replaceAll('=', '.');
  return PolicyName.safeParse(name).success ? name : undefined;
}

/** The audit subject of one policy. */
export function auditSubject(names: KvNames, policyName: string): string {
  return `${names.auditSubjectPrefix}.${policyKey(policyName)}`;
}
