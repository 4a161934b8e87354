/** The words a home sheds with, told apart by a requester of any version (core/wire/strict.ts HOME_SHED_WORDS). */
import { describe, expect, it } from 'vitest';
import { HOME_SHED_WORDS, homeShedOf } from '../../../../core/wire/strict.js';

describe('homeShedOf', () => {
  it('reads each reason from the words, wherever they stand in the message', () => {
    expect(homeShedOf(`${HOME_SHED_WORDS.late} (12 ms after it)`)).toBe('late');
    expect(homeShedOf(`${HOME_SHED_WORDS.admission} (in flight)`)).toBe('admission');
    // A store deadline reaches the reply inside the AGT_ERR_OVERLOADED message.
    expect(
      homeShedOf(
        `The agent is overloaded (store_deadline: ${HOME_SHED_WORDS.store_deadline}): nothing was decided or charged; retry after Retry-After`,
      ),
    ).toBe('store_deadline');
  });

  it("reads the previous version's messages, which carried the same words", () => {
    expect(homeShedOf('the home region took the request up too late to answer within its deadline')).toBe(
      'late',
    );
    expect(homeShedOf('the home region is overloaded (event loop delay)')).toBe('admission');
    expect(
      homeShedOf(
        "The agent is overloaded (the caller's deadline passed before the store could decide): nothing was decided or charged; retry after Retry-After",
      ),
    ).toBe('store_deadline');
  });

  it('answers undefined for words it does not know', () => {
    expect(homeShedOf('busy')).toBeUndefined();
  });
});
