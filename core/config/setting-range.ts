/**
 * The bounds and default of a numeric setting, read from the zod schema that defines it, so a service that takes
 * the setting from its environment (or a tool that derives it) uses the one definition instead of a copy.
 */
import type { z } from 'zod';

export interface SettingRange {
  min: number;
  max: number;
  default: number;
}

/** The range of a `z.number().min(a).max(b).default(d)` field (coerced or not). */
export function settingRange(field: z.ZodDefault<z.ZodNumber | z.ZodCoercedNumber>): SettingRange {
  const inner = field.unwrap();
  const value = field.def.defaultValue;
  const { minValue: min, maxValue: max } = inner;
  if (
    min === null ||
    max === null ||
    !Number.isFinite(min) ||
    !Number.isFinite(max) ||
    typeof value !== 'number'
  ) {
    throw new TypeError('settingRange needs a bounded number field with a default');
  }
  return { min, max, default: value };
}
