import { describe, expect, it } from 'vitest';
import {
  DEFAULT_ROUND_TRIPS,
  formatRoundTrips,
  missingPairs,
  parseRoundTrips,
  roundTripOf,
  RoundTripsText,
} from '../../core/distance.js';

describe('round-trip matrix', () => {
  it('reads pairs in either order, 0 within a region, undefined for a pair not named', () => {
    const parsed = parseRoundTrips(DEFAULT_ROUND_TRIPS);
    expect(parsed.ok).toBe(true);
    const m = parsed.ok ? parsed.roundTrips : new Map<string, number>();
    expect(roundTripOf(m, 'us', 'eu')).toBe(70);
    expect(roundTripOf(m, 'eu', 'us')).toBe(70);
    expect(roundTripOf(m, 'ap', 'eu')).toBe(220);
    expect(roundTripOf(m, 'ap', 'ap')).toBe(0);
    expect(roundTripOf(m, 'us', 'sa')).toBeUndefined();
    expect(missingPairs(m, ['us', 'eu', 'ap', 'sa'])).toEqual(['us-sa', 'eu-sa', 'ap-sa']);
    expect(formatRoundTrips(m, ['ap', 'eu', 'us'])).toBe('ap-eu=220,ap-us=150,eu-us=70');
  });

  it('splits region names that hold dashes where only one reading names two regions', () => {
    const known = parseRoundTrips('eu-west-us-east=80', ['eu-west', 'us-east']);
    expect(known.ok && roundTripOf(known.roundTrips, 'us-east', 'eu-west')).toBe(80);
    expect(parseRoundTrips('eu-west-us-east=80')).toEqual({
      ok: false,
      problems: ['eu-west-us-east can be read more than one way'],
    });
  });

  it('lists every problem: no =, a region paired with itself, a bad number, a pair given twice', () => {
    expect(parseRoundTrips('us-eu, us-us=3, us-ap=abc, eu-ap=20, ap-eu=30, us-ap=10001')).toEqual({
      ok: false,
      problems: [
        'us-eu: write A-B=MS',
        "us-us: a region's round trip to itself is 0",
        'us-ap: the round trip is a number of ms in [0, 10000]',
        'ap-eu is given twice',
        'us-ap: the round trip is a number of ms in [0, 10000]',
      ],
    });
    expect(RoundTripsText.safeParse('us-us=3').success).toBe(false);
    expect(RoundTripsText.parse('').size).toBe(0);
  });
});
