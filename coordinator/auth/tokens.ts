/**
 * Bearer tokens and the roles they grant. Presented tokens are compared as SHA-256 digests with
 * `crypto.timingSafeEqual`, against every configured token without an early exit, so neither the length nor a
 * matching prefix of a secret shows in the response time. Tokens never leave this module: callers see only
 * the principal (role and name).
 */
import { createHash, timingSafeEqual } from 'node:crypto';

/** `read` may read everything; `write` may also change policies. */
export type Role = 'read' | 'write';

/** Who a token stands for, as the audit trail records it. */
export interface Principal {
  readonly role: Role;
  /** A label for the token (`admin`, `reader`), never the token. */
  readonly name: string;
}

/** A configured token and the principal it authenticates. */
export interface TokenGrant {
  readonly token: string;
  readonly principal: Principal;
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Whether `role` may do what `required` guards. */
export function roleAllows(role: Role, required: Role): boolean {
  return role === 'write' || required === 'read';
}

export class TokenVerifier {
  readonly #grants: readonly { digest: Buffer; principal: Principal }[];

  constructor(grants: readonly TokenGrant[]) {
    if (grants.length === 0) throw new RangeError('configure at least one token');
    this.#grants = grants.map((g) => ({ digest: digest(g.token), principal: g.principal }));
  }

  /** The principal of a presented token, or `undefined` when it matches none. */
  verify(presented: string): Principal | undefined {
    const d = digest(presented);
    let found: Principal | undefined;
    for (const g of this.#grants) {
      if (timingSafeEqual(d, g.digest) && found === undefined) found = g.principal;
    }
    return found;
  }
}

/**
 * The grants of the coordinator's configuration: the admin token (write, named `admin`), the read token (read,
 * named `reader`), then the named tokens (`QP_ADMIN_TOKENS`), each with its own role and name.
 */
export function grantsFromConfig(
  adminToken: string | undefined,
  readToken: string | undefined,
  named: readonly { name: string; role: Role; token: string }[] = [],
): TokenGrant[] {
  const grants: TokenGrant[] = [];
  if (adminToken !== undefined)
    grants.push({ token: adminToken, principal: { role: 'write', name: 'admin' } });
  if (readToken !== undefined) grants.push({ token: readToken, principal: { role: 'read', name: 'reader' } });
  for (const t of named) grants.push({ token: t.token, principal: { role: t.role, name: t.name } });
  return grants;
}

/**
 * The token of an `Authorization: Bearer <token>` header (RFC 6750: scheme case-insensitive, one space), or
 * `undefined` when the header is absent or uses another scheme.
 */
export function bearerToken(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const match = /^bearer +([\x21-\x7e]+) *$/i.exec(header);
  return match?.[1];
}
