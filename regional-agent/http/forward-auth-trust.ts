/**
 * Who may ask forward-auth. Its answers spend a subject's budget on the word of headers (`X-Quota-Subject`, the
 * policy and cost headers, `X-Forwarded-For`), so they are honoured only from a configured trusted proxy
 * (`QP_TRUSTED_PROXIES`, by the connection's address, never by a header) and, when `QP_FORWARD_AUTH_SECRET` is
 * set, only with that shared secret in `QP_FORWARD_AUTH_SECRET_HEADER`. Anyone else gets
 * `400 AGT_ERR_UNTRUSTED_PROXY` and changes nothing.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { ownValue } from '../../core/own-keys.js';
import { AgentErrors } from '../errors.js';

export interface ForwardAuthTrustConfig {
  trustedProxies: readonly string[];
  forwardAuthSecret?: string | undefined;
  forwardAuthSecretHeader: string;
}

/** Throws AGT_ERR_UNTRUSTED_PROXY unless the request comes from a trusted proxy with the secret, if one is set. */
export type ForwardAuthTrust = (request: FastifyRequest) => void;

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

export function forwardAuthTrust(
  config: ForwardAuthTrustConfig,
  isTrustedAddress: (address: string) => boolean,
): ForwardAuthTrust {
  const secret = config.forwardAuthSecret === undefined ? undefined : digest(config.forwardAuthSecret);
  const header = config.forwardAuthSecretHeader;
  const none = config.trustedProxies.length === 0;
  return (request) => {
    const peer = request.socket.remoteAddress ?? '';
    if (none || !isTrustedAddress(peer)) {
      throw new AgentErrors.AGT_ERR_UNTRUSTED_PROXY(
        none
          ? 'no trusted proxy is configured (QP_TRUSTED_PROXIES), so forward-auth answers nobody'
          : `${peer} is not a trusted proxy (QP_TRUSTED_PROXIES)`,
      );
    }
    if (secret === undefined) return;
    const sent = ownValue(request.headers, header);
    // Digests have one length, so the comparison takes the same time whatever was sent.
    if (typeof sent !== 'string' || !timingSafeEqual(digest(sent), secret)) {
      throw new AgentErrors.AGT_ERR_UNTRUSTED_PROXY(`the shared secret header ${header} is missing or wrong`);
    }
  };
}
