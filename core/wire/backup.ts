/**
 * A backup of a coordinator's policies and audit trail (`GET /v1/backup`, `POST /v1/restore`, `quotaplane backup`
 * and `restore`): one JSON document. Policies are the stored specs (name and the fields the operator set), each
 * checked on restore with the same rules as a PUT; audit records oldest first, without their positions.
 */
import { z } from 'zod';
import { AuditRecord } from './admin.js';

export const BACKUP_FORMAT = 'quotaplane-backup' as const;
/** Most audit records a backup may carry (the audit trail's own largest bound, QP_AUDIT_MAX_RECORDS). */
export const MAX_BACKUP_AUDIT = 10_000_000;

export const Backup = z.strictObject({
  format: z.literal(BACKUP_FORMAT),
  version: z.literal(1),
  exportedAt: z.string().max(64),
  /** Stored specs: `{ "name": …, …the policy's fields }`, checked one by one on restore. */
  policies: z.array(z.unknown()).max(1_000_000),
  audit: z.array(AuditRecord).max(MAX_BACKUP_AUDIT),
});
export type Backup = z.infer<typeof Backup>;

/** `POST /v1/restore`'s answer: what was written. */
export const RestoreResult = z.object({
  policies: z.number().int().min(0),
  audit: z.number().int().min(0),
});
export type RestoreResult = z.infer<typeof RestoreResult>;
