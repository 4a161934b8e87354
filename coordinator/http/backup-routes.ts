/**
 * `GET /v1/backup` and `POST /v1/restore`: every policy and the whole audit trail out as one document, and back
 * into an empty coordinator. A restore checks the whole document first (its shape, every policy with the rules
 * of a PUT, unique names, the policy limit) and writes nothing unless all of it is good; it refuses a store that
 * already holds policies (409) so it never mixes two deployments. The audit records go in first (oldest first),
 * then each policy is created, audited as a `create` by the restoring token; the emptiness check and all of that
 * run as one step under the policy store's write lock (PolicyStore.restoreBackup), so of two concurrent restores one
 * wins whole and the other is refused (409) having written nothing.
 */
import type { onRequestHookHandler } from 'fastify';
import { AuditResponse, Problem, type AuditEntry, type AuditRecord } from '../../core/wire/admin.js';
import { Backup, BACKUP_FORMAT, RestoreResult } from '../../core/wire/backup.js';
import { PolicyName } from '../../core/policy/policy.js';
import type { AuditTrail } from '../audit/audit-trail.js';
import type { Role } from '../auth/tokens.js';
import { Errors, withFieldProblems } from '../errors.js';
import type { PolicyStore, StoredSpec } from '../policies/policy-store.js';
import { fieldProblems, policyBodyFor, validateSpec } from '../policies/validate.js';
import type { AdminApp } from './admin-app.js';
import { principalOf } from './auth-hook.js';

export interface BackupRoutesOptions {
  store: PolicyStore;
  audit: AuditTrail;
  regions: readonly string[];
  maxPolicies: number;
  /** Largest restore body, bytes. */
  bodyLimitBytes: number;
  auth: (role: Role) => onRequestHookHandler;
}

const PAGE = 1000;
const security = [{ bearerAuth: [] }];

export function registerBackupRoutes(app: AdminApp, options: BackupRoutesOptions): void {
  const { store, audit, regions, maxPolicies, auth } = options;
  const PolicyBody = policyBodyFor(regions);

  app.get(
    '/v1/backup',
    {
      onRequest: auth('read'),
      schema: {
        summary: 'Export policies and the audit trail',
        description: 'One document: every stored policy spec and every audit record, oldest first.',
        tags: ['backup'],
        security,
        response: { 200: Backup, 401: Problem, 503: Problem },
      },
    },
    async () => {
      const policies = (await store.list()).map((s) => s.spec);
      const entries: AuditEntry[] = [];
      let before: number | undefined;
      try {
        for (;;) {
          const page = AuditResponse.parse(
            await audit.read({ limit: PAGE, ...(before !== undefined ? { before } : {}) }),
          );
          entries.push(...page.entries);
          if (page.next === null || page.entries.length === 0) break;
          before = page.next;
        }
      } catch (error) {
        throw new Errors.STORE_UNAVAILABLE({ cause: error });
      }
      const records: AuditRecord[] = entries.reverse().map(({ seq: _seq, ...record }) => record);
      return {
        format: BACKUP_FORMAT,
        version: 1 as const,
        exportedAt: new Date().toISOString(),
        policies,
        audit: records,
      };
    },
  );

  app.post(
    '/v1/restore',
    {
      onRequest: auth('write'),
      bodyLimit: options.bodyLimitBytes,
      schema: {
        summary: 'Restore policies and the audit trail into an empty coordinator',
        description:
          'The document `GET /v1/backup` answers. Checked whole before anything is written: a bad or partial ' +
          'document is refused (400 COORD_ERR_VALIDATION, every problem listed) and changes nothing; a ' +
          'coordinator that already holds policies answers 409 COORD_ERR_RESTORE_NOT_EMPTY.',
        tags: ['backup'],
        security,
        body: Backup,
        response: {
          200: RestoreResult,
          400: Problem,
          401: Problem,
          403: Problem,
          409: Problem,
          413: Problem,
          415: Problem,
          503: Problem,
        },
      },
    },
    async (request) => {
      const backup = request.body;
      const problems: { path: string; message: string }[] = [];
      const specs: StoredSpec[] = [];
      const seen = new Set<string>();
      backup.policies.forEach((item, i) => {
        if (typeof item !== 'object' || item === null || Array.isArray(item)) {
          problems.push({ path: `policies.${i}`, message: 'a policy is an object with its name and fields' });
          return;
        }
        const { name, ...body } = item as Record<string, unknown>;
        const parsedName = PolicyName.safeParse(name);
        if (!parsedName.success) {
          problems.push(...fieldProblems(parsedName.error.issues, `policies.${i}.name`));
          return;
        }
        if (seen.has(parsedName.data)) {
          problems.push({ path: `policies.${i}.name`, message: `policy ${parsedName.data} appears twice` });
          return;
        }
        seen.add(parsedName.data);
        const checked = validateSpec(parsedName.data, body, PolicyBody);
        if (!checked.ok) {
          problems.push(
            ...checked.problems.map((p) => ({
              ...p,
              path: p.path === '' ? `policies.${i}` : `policies.${i}.${p.path}`,
            })),
          );
          return;
        }
        specs.push(checked.spec);
      });
      if (specs.length > maxPolicies && problems.length === 0) {
        problems.push({
          path: 'policies',
          message: `${specs.length} policies exceed QP_MAX_POLICIES (${maxPolicies})`,
        });
      }
      if (problems.length > 0) {
        throw withFieldProblems(
          new Errors.VALIDATION(`${problems.length} problem(s) in the backup`),
          problems,
        );
      }
      // The emptiness check, the audit records and every create happen under the store's write lock: a
      // concurrent restore (or PUT) that got there first makes this one a 409 that wrote nothing.
      const { role, name } = principalOf(request);
      await store.restoreBackup(specs, backup.audit, {
        actor: { role, name },
        requestId: request.id,
        source: request.ip,
      });
      return { policies: specs.length, audit: backup.audit.length };
    },
  );
}
