import { describe, expect, it } from 'vitest';
import { instrument, mismatch, parseDocumented, printed } from '../../helpers/doc-outputs.js';

describe('documented outputs', () => {
  const code = [
    "curl -s $A/v1/decisions -H 'content-type: application/json' \\",
    '  -d \'{"policy":"demo"}\'',
    '# {"allowed":true,"results":[{"remaining":29,…}],',
    '#  "headers":{"RateLimit":"\\"demo\\";r=29;t=2"}}',
    'curl -s -X PUT $C/v1/policies/x -D headers.txt',
    '# 201, ETag: "3"',
    '# {"name":"x",…}',
    'curl -s "$C/v1/audit"',
    '# e.g. {"entries":[{"seq":2,…}]}',
    'curl -s $C/v1/regions   # no output shown',
  ].join('\n');

  it('marks the commands whose output the docs show, and reads what they show', () => {
    const { code: marked, outputs } = instrument(code, 10, 1);
    expect(outputs).toEqual([
      {
        id: 1,
        line: 13,
        text: '{"allowed":true,"results":[{"remaining":29,…}],"headers":{"RateLimit":"\\"demo\\";r=29;t=2"}}',
      },
      { id: 2, line: 17, text: '{"name":"x",…}' },
    ]);
    const lines = marked.split('\n');
    expect(lines[0]).toBe("printf '\\n%s\\n' 'QP-EXAMPLE-OUTPUT-BEGIN 1'");
    expect(lines[3]).toBe("printf '\\n%s\\n' 'QP-EXAMPLE-OUTPUT-END 1'");
    expect(marked).not.toContain('BEGIN 3');
    expect(printed('x\nQP-EXAMPLE-OUTPUT-BEGIN 1\n{"a":1}\nQP-EXAMPLE-OUTPUT-END 1\n')).toEqual(
      new Map([[1, '{"a":1}']]),
    );
  });

  it('takes the elisions out and compares what is shown, and only that', () => {
    const shown = parseDocumented(
      '{"allowed":true,…,"results":[{"policy":"demo","remaining":29,"limit":30,…}],"headers":{"RateLimit":"r=29",…}}',
    );
    const actual = {
      allowed: true,
      retryAfterMs: 0,
      results: [{ policy: 'demo', allowed: true, remaining: 29, limit: 30, resetMs: 2000 }],
      headers: { RateLimit: 'r=29', 'RateLimit-Policy': 'q=30' },
    };
    expect(mismatch(actual, shown)).toBeUndefined();
    expect(mismatch({ ...actual, results: [{ ...actual.results[0], remaining: 28 }] }, shown)).toMatch(
      /remaining/,
    );
    expect(mismatch({ ...actual, headers: {} }, shown)).toBe('$.headers.RateLimit: shown, missing');
    // Shown elements appear in order among others.
    expect(
      mismatch(
        { policies: [{ name: 'demo' }, { name: 'exports', capacity: 5 }] },
        parseDocumented('{"policies":[{"name":"exports",…}]}'),
      ),
    ).toBeUndefined();
    expect(mismatch({ policies: [{ name: 'demo' }] }, { policies: [{ name: 'exports' }] })).toMatch(
      /no element/,
    );
    expect(() => parseDocumented('{"before":{…capacity:5…}}')).toThrow();
  });
});
