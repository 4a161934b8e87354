import { Counter, Gauge, type Registry } from 'prom-client';
import type { BorrowPlanner } from '../../core/borrowing/planner.js';

/** The borrowing metrics of one agent (labels carry policies, regions and outcomes, never a subject). */
export interface BorrowMetrics {
  borrows: Counter<'policy' | 'kind' | 'outcome'>;
  loanRequests: Counter<'lender' | 'answer'>;
  borrowedTokens: Counter<'policy'>;
  droppedTokens: Counter<'policy' | 'reason'>;
  loansServed: Counter<'from' | 'outcome'>;
  lentTokens: Counter<'policy'>;
  /** Optional (older registries): grants believed only in part or not at all (core/borrowing/loan-bounds.ts). */
  distrustedGrants?: Counter<'lender' | 'problem'>;
  /** Optional: grants that arrived after their borrow stopped waiting, credited all the same. */
  lateGrants?: Counter<'lender'>;
}

export function borrowMetrics(registry: Registry, planner: BorrowPlanner): BorrowMetrics {
  const registers = [registry];
  new Gauge({
    name: 'quotaplane_borrow_memory_entries',
    help: 'Entries of the borrow planner’s dry memory (bounded by QP_BORROW_MEMORY).',
    registers,
    collect() {
      this.set(planner.size);
    },
  });
  new Gauge({
    name: 'quotaplane_borrows_in_flight',
    help: 'Borrows running now (one per policy and subject at most).',
    registers,
    collect() {
      this.set(planner.inFlight);
    },
  });
  return {
    borrows: new Counter({
      name: 'quotaplane_borrows_total',
      help: 'Borrows for a subject whose bucket here ran dry (kind refusal) or fell below the low-water mark (kind top_up), by policy, kind and outcome (covered, subject_exhausted, share_exhausted).',
      labelNames: ['policy', 'kind', 'outcome'],
      registers,
    }),
    loanRequests: new Counter({
      name: 'quotaplane_loan_requests_total',
      help: 'Loan requests sent to other regions, by lender and answer (grant, refused, unreachable, timeout, late).',
      labelNames: ['lender', 'answer'],
      registers,
    }),
    borrowedTokens: new Counter({
      name: 'quotaplane_borrowed_tokens_total',
      help: 'Tokens borrowed from other regions and credited to buckets here.',
      labelNames: ['policy'],
      registers,
    }),
    droppedTokens: new Counter({
      name: 'quotaplane_borrow_tokens_dropped_total',
      help: 'Borrowed tokens not credited here: gone, never minted again. By reason: no_room (the bucket was full), credit_failed (the store failed the credit; a borrow whose credit failed counts all its drops here), share_moved (a grant that arrived after the borrower stopped waiting, when the share had moved since the ask).',
      labelNames: ['policy', 'reason'],
      registers,
    }),
    loansServed: new Counter({
      name: 'quotaplane_loans_served_total',
      help: 'Loan requests this agent answered for other regions, by origin and outcome (granted, dry, or an error code).',
      labelNames: ['from', 'outcome'],
      registers,
    }),
    lentTokens: new Counter({
      name: 'quotaplane_lent_tokens_total',
      help: 'Tokens taken from buckets here and handed to other regions.',
      labelNames: ['policy'],
      registers,
    }),
    distrustedGrants: new Counter({
      name: 'quotaplane_loan_grants_distrusted_total',
      help: 'Loan grants believed only in part (over_bound: more than the lender’s share could have held) or not at all (over_asked: more than asked), by lender and problem.',
      labelNames: ['lender', 'problem'],
      registers,
    }),
    lateGrants: new Counter({
      name: 'quotaplane_loan_grants_late_total',
      help: 'Loan grants that arrived after their borrow stopped waiting (the lender had taken the tokens), credited to the bucket all the same, by lender.',
      labelNames: ['lender'],
      registers,
    }),
  };
}
