import { z } from 'zod';

/**
 * A number as a query parameter or a header carries it: decimal digits with an optional sign, fraction and
 * exponent, and nothing else. `z.coerce.number` also took `0x10`, `0b1`, a blank (as 0) and surrounding spaces; a
 * parameter given twice (an array) is refused as well. The number it reads is then checked by `pipe`.
 */
export const DecimalText = z
  .string()
  .regex(/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/, 'must be a decimal number')
  .transform(Number);
