/**
 * The `quotaplane` command against a real coordinator (with its protocol engine) and real agents on NATS and
 * Redis: every policy command with ETags handled, a write that loses a real race, the API's refusals with their
 * codes, allocations and agents as the engine holds them, and the `bin` through npx.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, READ_TOKEN } from '../../helpers/coordinator-fixture.js';
import { cli, REPO_ROOT } from '../../helpers/cli-runner.js';
import { startStack, type ServiceStack } from '../../helpers/fixture/index.js';
import { eventually } from '../../helpers/wait.js';

let stack: ServiceStack;
let env: Record<string, string>;

beforeAll(async () => {
  stack = await startStack({ agentsPerRegion: 1 });
  env = { QUOTAPLANE_URL: stack.coordinator.url, QUOTAPLANE_TOKEN: ADMIN_TOKEN };
}, 60_000);
afterAll(async () => {
  await stack?.[Symbol.asyncDispose]();
});

async function etagOf(name: string): Promise<string | null> {
  const res = await stack.admin('GET', `/v1/policies/${name}`);
  return res.status === 200 ? res.headers.get('etag') : null;
}

const waitFor = (check: () => Promise<boolean>, ms: number, what: string) => eventually(check, ms, what, 50);

describe('quotaplane policy', () => {
  it('creates, reads, replaces, patches, sets the budget and deletes, each write on the ETag it read', async () => {
    const put = await cli(['policy', 'put', 'cli-a', '--capacity', '30', '--refill', '0.5'], { env });
    expect(put.stderr).toBe('');
    expect(put.status).toBe(0);
    const created = await etagOf('cli-a');
    expect(put.stdout).toContain(`created policy "cli-a" (ETag ${created})`);

    const get = await cli(['policy', 'get', 'cli-a', '--json'], { env });
    expect(JSON.parse(get.stdout)).toEqual({
      etag: created,
      policy: {
        name: 'cli-a',
        kind: 'token_bucket',
        capacity: 30,
        refillPerSecond: 0.5,
        maxCost: 1,
        mode: 'regional',
        onStoreFailure: 'closed',
        idleTtlSeconds: 60,
        version: 1,
      },
    });

    // put again: replaces with If-Match on the ETag it read.
    const replace = await cli(['policy', 'put', 'cli-a', '--capacity', '40', '--refill', '0.5', '--json'], {
      env,
    });
    expect(replace.status).toBe(0);
    const replaced = JSON.parse(replace.stdout) as {
      result: string;
      etag: string;
      policy: { capacity: number };
    };
    expect(replaced.result).toBe('stored');
    expect(replaced.etag).not.toBe(created);
    expect(replaced.etag).toBe(await etagOf('cli-a'));

    // patch one field: the derived idle TTL follows the new budget (not pinned at 80 s).
    const patch = await cli(['policy', 'patch', 'cli-a', '--refill', '0.25', '--json'], { env });
    expect(patch.status).toBe(0);
    const patched = JSON.parse(patch.stdout) as { policy: Record<string, unknown> };
    expect(patched.policy).toMatchObject({
      capacity: 40,
      refillPerSecond: 0.25,
      idleTtlSeconds: 160,
      maxCost: 1,
    });
    const budget = await cli(['budget', 'set', 'cli-a', '--capacity', '80'], { env });
    expect(budget.status).toBe(0);
    expect(budget.stdout).toContain(`budget of "cli-a" set (ETag ${await etagOf('cli-a')})`);
    expect(budget.stdout).toMatch(/capacity\s+40\s+80/);
    expect(budget.stdout).toMatch(/idle ttl \(s\)\s+160\s+320/);
    // With --if-match the command still shows what it replaced: the budget read under that ETag.
    const tag = (await etagOf('cli-a'))!;
    const matched = await cli(
      ['budget', 'set', 'cli-a', '--capacity', '40', '--if-match', tag.replace(/"/g, '')],
      {
        env,
      },
    );
    expect(matched.status).toBe(0);
    expect(matched.stdout).toMatch(/capacity\s+80\s+40/);
    expect(matched.stdout).toMatch(/refill\/s\s+[\d.]+\s+[\d.]+$/m);
    expect(matched.stdout).not.toContain('—');

    const audit = (await (await stack.admin('GET', '/v1/audit?policy=cli-a')).json()) as {
      entries: { action: string }[];
    };
    // Policy changes only: the rebalancer's share moves of the policy are audit records too.
    expect(audit.entries.map((e) => e.action).filter((a) => a !== 'move')).toEqual([
      'budget',
      'budget',
      'replace',
      'replace',
      'create',
    ]);

    const del = await cli(['policy', 'delete', 'cli-a'], { env });
    expect(del.status).toBe(0);
    expect(del.stdout).toBe('deleted policy "cli-a"\n');
    expect(await etagOf('cli-a')).toBeNull();
  });

  it("audit: operators' changes by default, the rebalancer's moves counted, and listed by column with --moves", async () => {
    await cli(['policy', 'put', 'cli-audit', '--capacity', '30', '--refill', '1'], { env });
    await cli(['budget', 'set', 'cli-audit', '--capacity', '60'], { env });
    // The first allocation of the policy is a move record: wait for it, then read a fixed range (before = end).
    type Trail = { entries: { seq: number; action: string }[]; movesHidden?: number };
    let all: Trail = { entries: [] };
    await waitFor(
      async () => {
        all = (await (await stack.admin('GET', '/v1/audit?policy=cli-audit&limit=1000')).json()) as Trail;
        return all.entries.some((e) => e.action === 'move');
      },
      10_000,
      'a move of cli-audit',
    );
    const before = String(all.entries[0]!.seq + 1);
    const moves = all.entries.filter((e) => e.action === 'move').length;
    const hidden = (await (
      await stack.admin('GET', `/v1/audit?policy=cli-audit&moves=hide&before=${before}`)
    ).json()) as Trail;
    expect(hidden.entries.map((e) => e.action)).toEqual(['budget', 'create']);
    expect(hidden.movesHidden).toBe(moves);

    const r = await cli(['audit', 'cli-audit', '--before', before], { env });
    expect(r.status).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^SEQ\s+WHEN\s+WHO\s+ACTION\s+POLICY\s+ETAG\s+CHANGE$/);
    expect(lines[1]).toMatch(/\sbudget\s+cli-audit\s+"\d+"\s+capacity 30 → 60$/);
    expect(lines[2]).toMatch(/\screate\s+cli-audit\s+"\d+"\s+capacity 30, refill\/s 1$/);
    expect(lines[3]).toBe(
      `${moves} rebalancer ${moves === 1 ? 'move' : 'moves'} left out (--moves lists them)`,
    );
    expect(lines).toHaveLength(4);

    const listed = await cli(['audit', 'cli-audit', '--moves', '--before', before], { env });
    const moveLines = listed.stdout.trimEnd().split('\n');
    const header = moveLines.findIndex((l) => l.startsWith('SEQ') && l.includes('REASON'));
    expect(moveLines[header]).toMatch(/^SEQ\s+WHEN\s+POLICY\s+EPOCH\s+REASON\s+AP\s+EU\s+US\s+DEMAND\/S AP/);
    expect(moveLines.slice(header + 1)).toHaveLength(moves);
    for (const l of moveLines.slice(header + 1)) expect(l).toMatch(/\scli-audit\s.*(\d+\.\d\d%\s+){3}/);
  });

  it('lists policies as a table', async () => {
    await cli(['policy', 'put', 'cli-list-b', '--capacity', '5', '--refill', '1', '--mode', 'local'], {
      env,
    });
    await cli(['policy', 'put', 'cli-list-a', '--capacity', '12.5', '--refill', '0.1'], { env });
    const list = await cli(['policy', 'list'], { env });
    expect(list.status).toBe(0);
    const lines = list.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(
      /^NAME\s+CAPACITY\s+REFILL\/S\s+MAX COST\s+MODE\s+HOME\s+ON FAILURE\s+TTL S\s+KEY VERSION$/,
    );
    const a = lines.find((l) => l.startsWith('cli-list-a '))!.split(/\s+/);
    expect(a).toEqual(['cli-list-a', '12.5', '0.1', '1', 'regional', '—', 'closed', '125', '1']);
    expect(lines.find((l) => l.startsWith('cli-list-b '))).toMatch(/\blocal\b/);
    // One notion each: the body's version is the key version, the revision is the ETag.
    const get = await cli(['policy', 'get', 'cli-list-a'], { env });
    expect(get.stdout).toMatch(/^key version\s+1$/m);
    expect(get.stdout).toContain(`etag (revision)   ${(await etagOf('cli-list-a'))!}\n`);
  });

  it('reads a policy from a file or standard input', async () => {
    const r = await cli(['policy', 'put', 'cli-stdin', '--file', '-'], {
      env,
      stdin: JSON.stringify({ capacity: 9, refillPerSecond: 3, onStoreFailure: 'local' }),
    });
    expect(r.status).toBe(0);
    const get = JSON.parse((await cli(['policy', 'get', 'cli-stdin', '--json'], { env })).stdout) as {
      policy: { onStoreFailure: string; capacity: number };
    };
    expect(get.policy).toMatchObject({ capacity: 9, onStoreFailure: 'local' });
  });

  it('loses a real race cleanly: a write between its read and its write is kept, and it exits 1', async () => {
    await cli(['policy', 'put', 'cli-race', '--capacity', '10', '--refill', '1'], { env });
    let interfered = false;
    // Another operator's write lands on the real coordinator after this command read the ETag.
    const racing: typeof fetch = async (input, init) => {
      if (init?.method === 'PATCH' && !interfered) {
        interfered = true;
        const other = await stack.admin('PATCH', '/v1/policies/cli-race/budget', { capacity: 25 });
        expect(other.status).toBe(200);
      }
      return fetch(input, init);
    };
    const r = await cli(['budget', 'set', 'cli-race', '--capacity', '99'], { env, fetch: racing });
    expect(interfered).toBe(true);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(
      /^quotaplane: COORD_ERR_PRECONDITION_FAILED \(412\): policy "cli-race" changed since this command read it/,
    );
    const now = JSON.parse((await cli(['policy', 'get', 'cli-race', '--json'], { env })).stdout) as {
      policy: { capacity: number };
    };
    expect(now.policy.capacity).toBe(25);
  });

  it('passes an explicit stale --if-match to the API and reports its 412', async () => {
    await cli(['policy', 'put', 'cli-stale', '--capacity', '10', '--refill', '1'], { env });
    const before = await etagOf('cli-stale');
    await cli(['budget', 'set', 'cli-stale', '--capacity', '11'], { env });
    const r = await cli(['policy', 'delete', 'cli-stale', '--if-match', before!.replace(/"/g, '')], { env });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('COORD_ERR_PRECONDITION_FAILED (412)');
    expect(await etagOf('cli-stale')).not.toBeNull();
    const create = await cli(['policy', 'put', 'cli-stale', '--capacity', '1', '--refill', '1', '--create'], {
      env,
    });
    expect(create.status).toBe(1);
    expect(create.stderr).toContain('COORD_ERR_PRECONDITION_FAILED (412)');
  });

  it("prints the API's refusals with their codes and every field problem, and changes nothing", async () => {
    const invalid = await cli(
      ['policy', 'put', 'cli-bad', '--capacity', '0', '--refill', '1', '--max-cost', '5'],
      { env },
    );
    expect(invalid.status).toBe(1);
    expect(invalid.stderr).toMatch(/^quotaplane: COORD_ERR_VALIDATION \(400\)/);
    expect(invalid.stderr).toBe(
      [
        'quotaplane: COORD_ERR_VALIDATION (400): The request is invalid',
        '  - body.capacity: capacity must be > 0',
        '  - body.maxCost: maxCost must be ≤ capacity',
        '',
      ].join('\n'),
    );
    expect(await etagOf('cli-bad')).toBeNull();

    const missing = await cli(['policy', 'get', 'cli-nothing'], { env });
    expect(missing.status).toBe(1);
    expect(missing.stderr).toMatch(/^quotaplane: COORD_ERR_POLICY_NOT_FOUND \(404\)/);
    const patchMissing = await cli(['policy', 'patch', 'cli-nothing', '--capacity', '3'], { env });
    expect(patchMissing.stderr).toMatch(/^quotaplane: COORD_ERR_POLICY_NOT_FOUND \(404\)/);
    const deleteMissing = await cli(['policy', 'delete', 'cli-nothing'], { env });
    expect(deleteMissing.stderr).toMatch(/^quotaplane: COORD_ERR_POLICY_NOT_FOUND \(404\)/);

    const reader = await cli(
      ['policy', 'put', 'cli-ro', '--capacity', '1', '--refill', '1', '--token', READ_TOKEN],
      { env },
    );
    expect(reader.status).toBe(1);
    expect(reader.stderr).toMatch(/^quotaplane: COORD_ERR_FORBIDDEN \(403\)/);
    const wrong = await cli(['policy', 'list'], {
      env: { ...env, QUOTAPLANE_TOKEN: 'not-a-token-of-this-coordinator' },
    });
    expect(wrong.status).toBe(1);
    expect(wrong.stderr).toMatch(/^quotaplane: COORD_ERR_UNAUTHORIZED \(401\)/);
    expect(await etagOf('cli-ro')).toBeNull();
  });
});

describe('quotaplane allocations and agents', () => {
  it('shows every region of a policy once the agents hold leases, and every agent live', async () => {
    await cli(['policy', 'put', 'cli-alloc', '--capacity', '90', '--refill', '1.5'], { env });
    await stack.ready(['cli-alloc']);
    type Alloc = {
      policies: {
        policy: string;
        shares: Record<string, number>;
        leases: Record<string, { acked: boolean }>;
      }[];
    };
    let alloc: Alloc = { policies: [] };
    await waitFor(
      async () => {
        const r = await cli(['allocations', 'cli-alloc', '--json'], { env });
        if (r.status !== 0) return false;
        alloc = JSON.parse(r.stdout) as Alloc;
        const leases = alloc.policies[0]?.leases ?? {};
        return ['us', 'eu', 'ap'].every((region) => leases[region]?.acked === true);
      },
      15_000,
      'every region acknowledged cli-alloc',
    );
    const shares = alloc.policies[0]!.shares;
    expect(Object.keys(shares).sort()).toEqual(['ap', 'eu', 'us']);
    expect(Object.values(shares).reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1);

    const table = await cli(['allocations', 'cli-alloc'], { env });
    expect(table.status).toBe(0);
    const rows = table.stdout.trimEnd().split('\n');
    expect(rows[0]).toMatch(
      /^POLICY\s+EPOCH\s+REGION\s+SHARE\s+PENDING\s+CAPACITY\s+REFILL\/S\s+DEMAND\/S\s+ADMITTED\/S\s+REFUSED\/S\s+LEASE ENDS\s+ACKED\s+HOLDERS\s+RENEWED$/,
    );
    expect(rows.filter((r) => r.startsWith('cli-alloc ')).map((r) => r.split(/\s+/)[2])).toEqual(
      Object.keys(shares),
    );

    const agents = await cli(['agents'], { env });
    expect(agents.status).toBe(0);
    for (const region of ['us', 'eu', 'ap'])
      expect(agents.stdout).toMatch(new RegExp(`^${region}\\s+1\\s+.*\\s+ok$`, 'm'));
    // The stack fixture names its agents' instances `<region>-<n>`.
    for (const region of ['us', 'eu', 'ap']) {
      expect(agents.stdout).toMatch(new RegExp(`^${region}\\s+${region}-\\d+\\s+.*\\blive$`, 'm'));
    }

    // A request was sent and answered: exit 1, as a refusal (2 is a command line that sent nothing).
    const none = await cli(['allocations', 'cli-never'], { env });
    expect(none.status).toBe(1);
    expect(none.stderr).toContain('holds no allocation of policy "cli-never"');
  });
});

describe('quotaplane on a pipe', () => {
  it('stops quietly, exit 0, when the reader of its output has gone (`quotaplane audit | head -1`)', async () => {
    const child = spawn(process.execPath, ['bin/quotaplane.mjs', 'audit'], {
      cwd: REPO_ROOT,
      env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? '/root', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // The reader leaves before the command writes a byte: each of its writes fails with EPIPE.
    child.stdout.destroy();
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.once('exit', (c, s) => resolve([c, s])),
    );
    expect(err).toBe('');
    expect([code, signal]).toEqual([0, null]);
  }, 60_000);
});

describe('npx quotaplane', () => {
  it('runs the package bin from the repository', async () => {
    const child = spawn('npx', ['--no-install', 'quotaplane', 'policy', 'list', '--json'], {
      cwd: REPO_ROOT,
      env: { PATH: process.env['PATH'] ?? '', HOME: process.env['HOME'] ?? '/root', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    expect(err).toBe('');
    expect(code).toBe(0);
    const names = (JSON.parse(out) as { policies: { name: string }[] }).policies.map((p) => p.name);
    expect(names).toContain('cli-list-a');
    // npx, then node compiling the CLI through tsx: 30 s was missed at a load average above 20 on two cores.
  }, 90_000);
});
