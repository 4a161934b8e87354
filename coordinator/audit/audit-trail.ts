import type { AuditQuery, AuditRecord, AuditResponse } from '../../core/wire/admin.js';

/** Where every policy change is recorded: who, what, before, after, when. */
export interface AuditTrail {
  /**
   * Append one record. Rejects when it could not be stored. `imported`: a record of another deployment's trail (a
   * restore), never taken for a duplicate of one this deployment writes.
   */
  record(record: AuditRecord, options?: { imported?: boolean }): Promise<void>;
  /** Records newest first, optionally of one policy and before a position, at most `query.limit`. */
  read(query: AuditQuery): Promise<AuditResponse>;
}
