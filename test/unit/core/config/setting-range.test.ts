import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, loadConfig } from '../../../../coordinator/config.js';
import { LeaseSettings } from '../../../../core/lease/settings.js';
import { settingRange } from '../../../../core/config/setting-range.js';

describe('settingRange', () => {
  it('reads the bounds and default of a numeric setting from its schema', () => {
    expect(settingRange(LeaseSettings.shape.leaseMs)).toEqual({ min: 100, max: 600_000, default: 6000 });
    expect(settingRange(z.coerce.number().int().min(1).max(10).default(5))).toEqual({
      min: 1,
      max: 10,
      default: 5,
    });
  });

  it('refuses a field without both bounds', () => {
    expect(() => settingRange(z.number().min(1).default(5))).toThrow(TypeError);
  });

  it("the coordinator's environment takes exactly the core schema's bounds", () => {
    const base = { QP_REGIONS: 'us,eu', QP_ADMIN_TOKEN: 'admin-secret-0123456789' };
    const { min, max } = settingRange(LeaseSettings.shape.skewMs);
    expect(loadConfig({ ...base, QP_SKEW_MS: String(min) }).protocol.lease.skewMs).toBe(min);
    expect(() => loadConfig({ ...base, QP_SKEW_MS: String(max + 1) })).toThrow(ConfigError);
  });
});
