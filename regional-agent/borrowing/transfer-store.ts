import type {
  EncodedCredit,
  EncodedCreditResult,
  EncodedLend,
  EncodedLendResult,
} from '../../core/models/transfer.js';

/**
 * Where lends and credits run: `lua/lend.lua` and `lua/credit.lua` on this region's Redis. Throws only when
 * something broke (and LendTooLateError for a lend that ran past its deadline, having taken nothing).
 */
export interface TransferStore {
  /** Lend from this region's bucket; the script refuses to run after `deadlineAtMs` (epoch ms, this clock). */
  lend(lend: EncodedLend, deadlineAtMs: number): Promise<EncodedLendResult>;
  /** Credit granted tokens to this region's bucket. */
  credit(credit: EncodedCredit): Promise<EncodedCreditResult>;
}
