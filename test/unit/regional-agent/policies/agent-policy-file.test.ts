import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  FilePolicySource,
  PolicyFileError,
  parsePoliciesFile,
} from '../../../../regional-agent/policies/file-policy-source.js';
import { eventually } from '../../../helpers/wait.js';

const dirs: string[] = [];
function file(text: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'qp-policies-'));
  dirs.push(dir);
  const path = join(dir, 'policies.json');
  writeFileSync(path, text);
  return path;
}
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe('policies file', () => {
  it('validates every policy with PolicySpec and fills defaults', () => {
    const policies = parsePoliciesFile(
      'p',
      JSON.stringify({ policies: { writes: { capacity: 10, refillPerSecond: 2 } } }),
    );
    expect(policies.get('writes')).toMatchObject({
      name: 'writes',
      capacity: 10,
      maxCost: 1,
      mode: 'regional',
      onStoreFailure: 'closed',
      idleTtlSeconds: 60,
      version: 1,
    });
  });

  it('lists every problem of every policy at once', () => {
    const text = JSON.stringify({
      policies: {
        a: { capacity: -1, refillPerSecond: 1 },
        b: { capacity: 10, refillPerSecond: 1, mode: 'strict' },
        c: { capacity: 10, refillPerSecond: 1, maxCost: 20, colour: 'red' },
        'Bad Name': { capacity: 1, refillPerSecond: 1 },
      },
    });
    let error: PolicyFileError | undefined;
    try {
      parsePoliciesFile('p.json', text);
    } catch (e) {
      error = e as PolicyFileError;
    }
    expect(error).toBeInstanceOf(PolicyFileError);
    // The name check fails first and alone (the file's shape), then a fixed file lists the rest.
    expect(error!.problems.join('\n')).toMatch(/Bad Name/);
    const fixed = JSON.stringify({
      policies: {
        a: { capacity: -1, refillPerSecond: 1 },
        b: { capacity: 10, refillPerSecond: 1, mode: 'strict' },
        c: { capacity: 10, refillPerSecond: 1, maxCost: 20, colour: 'red' },
      },
    });
    try {
      parsePoliciesFile('p.json', fixed);
    } catch (e) {
      error = e as PolicyFileError;
    }
    const all = error!.problems.join('\n');
    expect(all).toMatch(/policies\.a\.capacity/);
    expect(all).toMatch(/policies\.b\.homeRegion: strict policies need a homeRegion/);
    expect(all).toMatch(/policies\.c\.: Unrecognized key: "colour"|policies\.c\..*colour/);
    expect(all).toMatch(/policies\.c\.maxCost/);
  });

  it('refuses text that is not JSON, naming the file', () => {
    expect(() => parsePoliciesFile('p.json', '{')).toThrow(/policies file p.json is invalid/);
  });

  it('reloads on change, and keeps the last good set when the new file is broken', async () => {
    const path = file(JSON.stringify({ policies: { a: { capacity: 1, refillPerSecond: 1 } } }));
    const errors: Error[] = [];
    const source = new FilePolicySource(path, { watch: true, onReloadError: (e) => errors.push(e) });
    await source.ready();
    expect([...source.current().keys()]).toEqual(['a']);
    const changed = new Promise<string[]>((resolve) => source.onChange((p) => resolve([...p.keys()])));
    writeFileSync(
      path,
      JSON.stringify({
        policies: { a: { capacity: 1, refillPerSecond: 1 }, b: { capacity: 2, refillPerSecond: 1 } },
      }),
    );
    expect(await changed).toEqual(['a', 'b']);
    writeFileSync(path, '{"policies": {"a": {"capacity": 0}}}');
    await eventually(() => errors.length > 0, 5000, 'the refused file reported', 20);
    expect(errors[0]).toBeInstanceOf(PolicyFileError);
    expect([...source.current().keys()]).toEqual(['a', 'b']);
    await source.close();
  });

  it('rejects ready() when the file cannot be read', async () => {
    await expect(new FilePolicySource('/nonexistent/policies.json').ready()).rejects.toThrow(/cannot read/);
  });
});
