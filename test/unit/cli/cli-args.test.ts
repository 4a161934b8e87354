/**
 * The `quotaplane` command line before any request: usage errors exit 2 and send nothing, help exits 0, ETags are
 * quoted, tables align, and a policy's derived fields are left derived when a patch sends the policy back.
 */
import { describe, expect, it } from 'vitest';
import { quoteEtag, storedSpec } from '../../../cli/commands/policy.js';
import { regionHealth } from '../../../cli/commands/allocations.js';
import { percent, relative, table } from '../../../cli/table.js';
import { cli } from '../../helpers/cli-runner.js';

const noNetwork: typeof fetch = () => {
  throw new Error('the command line was wrong: no request may be sent');
};

describe('quotaplane command line', () => {
  it.each([
    [['policy', 'put', 'p', '--capacity', 'ten', '--refill', '1'], '--capacity needs a number, got "ten"'],
    [['policy', 'put', 'p'], 'no policy fields given'],
    [['policy', 'put', 'p', '--capacity', '1', '--file', 'x.json'], 'either as field flags or as --file'],
    [['policy', 'put', 'p', '--capacity', '1', '--create', '--if-match', '3'], '--create and --if-match'],
    [['policy', 'get'], 'missing NAME'],
    [['policy', 'get', 'a', 'b'], 'unexpected argument "b"'],
    [['policy', 'rename', 'a'], 'unknown policy command "rename"'],
    [['policy', 'list', '--colour'], "Unknown option '--colour'"],
    [['budget', 'set', 'p'], 'give --capacity, --refill or both'],
    [['budget', 'raise', 'p'], 'unknown budget command "raise"'],
    [['policy', 'patch', 'p'], 'no field to change'],
    [['frobnicate'], 'unknown command "frobnicate"'],
    // Its usage goes to standard error with the message, as for every other usage error.
    [['policy'], 'missing a policy command'],
    [['budget'], 'missing a budget command'],
    [['policy', 'list', '--timeout-ms', '0'], '--timeout-ms needs a whole number > 0'],
    // Above Node's longest timer it fired at once ("no answer within …") or threw as "cannot reach".
    [['policy', 'list', '--timeout-ms', '3000000000'], '--timeout-ms needs a whole number ≤ 2147483647'],
    [['explain', 'p', 's', '--agent', ','], '--agent names no agent'],
    [['stack', '--state-file'], '--state-file needs a path'],
  ])('%j exits 2 with "%s" and sends nothing', async (argv, message) => {
    const r = await cli(argv, { fetch: noNetwork });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(message);
    expect(r.stdout).toBe('');
  });

  it('prints its usage on --help (0) and without a command (2)', async () => {
    const help = await cli(['--help'], { fetch: noNetwork });
    expect(help.status).toBe(0);
    expect(help.stdout).toContain('policy list|get|put|patch|delete');
    const bare = await cli([], { fetch: noNetwork });
    expect(bare.status).toBe(2);
    const topic = await cli(['help', 'policy'], { fetch: noNetwork });
    expect(topic.status).toBe(0);
    expect(topic.stdout).toBe((await cli(['policy', '--help'], { fetch: noNetwork })).stdout);
    expect(topic.stdout).not.toBe(help.stdout);
    const sub = await cli(['policy', 'put', '--help'], { fetch: noNetwork });
    expect(sub.status).toBe(0);
    expect(sub.stdout).toContain('quotaplane policy put NAME');
  });

  it('names an unreachable coordinator and exits 3', async () => {
    const refused: typeof fetch = () =>
      Promise.reject(
        new TypeError('fetch failed', {
          cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), { code: 'ECONNREFUSED' }),
        }),
      );
    const r = await cli(['policy', 'list', '--url', 'http://127.0.0.1:9'], { fetch: refused });
    expect(r.status).toBe(3);
    expect(r.stderr).toBe(
      'quotaplane: cannot reach the coordinator at http://127.0.0.1:9: ECONNREFUSED connect ECONNREFUSED 127.0.0.1:9\n',
    );
  });

  it('a name the coordinator holds nothing of is exit 1 (a request was sent), not a usage error', async () => {
    const answer: typeof fetch = (input) => {
      const url = input instanceof Request ? input.url : input.toString();
      return Promise.resolve(Response.json(url.endsWith('/v1/regions') ? { regions: [] } : { policies: [] }));
    };
    const env = { QUOTAPLANE_URL: 'http://coordinator.test', QUOTAPLANE_TOKEN: 't' };
    const policy = await cli(['allocations', 'nope'], { fetch: answer, env });
    expect(policy.status).toBe(1);
    expect(policy.stderr).toBe('quotaplane: the coordinator holds no allocation of policy "nope"\n');
    const region = await cli(['agents', '--region', 'zz'], { fetch: answer, env });
    expect(region.status).toBe(1);
    expect(region.stderr).toBe('quotaplane: "zz" is not a configured region ()\n');
  });

  it('takes the URL and token from flags first, then the environment', async () => {
    const seen: { url: string; auth: string | null }[] = [];
    const record: typeof fetch = (input, init) => {
      seen.push({
        url: input instanceof Request ? input.url : input.toString(),
        auth: new Headers(init?.headers).get('authorization'),
      });
      return Promise.resolve(Response.json({ policies: [] }));
    };
    const env = {
      QUOTAPLANE_URL: 'http://10.9.9.9:1',
      QP_ADMIN_TOKEN: 'from-admin-env',
      QUOTAPLANE_TOKEN: 'from-cli-env',
    };
    await cli(['policy', 'list'], { env, fetch: record });
    await cli(['policy', 'list', '--url', 'http://127.0.0.2:7', '--token', 'from-flag'], {
      env,
      fetch: record,
    });
    await cli(['policy', 'list'], { env: { QP_READ_TOKEN: 'reader' }, fetch: record });
    expect(seen).toEqual([
      { url: 'http://10.9.9.9:1/v1/policies', auth: 'Bearer from-cli-env' },
      { url: 'http://127.0.0.2:7/v1/policies', auth: 'Bearer from-flag' },
      { url: 'http://127.0.0.1:7100/v1/policies', auth: 'Bearer reader' },
    ]);
  });

  it('takes the global flags before the command, between its words, or after them', async () => {
    const seen: { url: string; auth: string | null }[] = [];
    const record: typeof fetch = (input, init) => {
      seen.push({
        url: input instanceof Request ? input.url : input.toString(),
        auth: new Headers(init?.headers).get('authorization'),
      });
      return Promise.resolve(Response.json({ policies: [] }));
    };
    const lines = [
      ['--url', 'http://127.0.0.3:1', '--token=t1', 'policy', 'list'],
      ['--url=http://127.0.0.3:2', 'policy', '--token', 't2', 'list'],
      ['policy', 'list', '--url', 'http://127.0.0.3:3', '--token', 't3'],
    ];
    for (const argv of lines) expect((await cli(argv, { fetch: record })).status).toBe(0);
    expect(seen).toEqual([
      { url: 'http://127.0.0.3:1/v1/policies', auth: 'Bearer t1' },
      { url: 'http://127.0.0.3:2/v1/policies', auth: 'Bearer t2' },
      { url: 'http://127.0.0.3:3/v1/policies', auth: 'Bearer t3' },
    ]);
    const json = await cli(['--json', 'policy', 'list'], { fetch: record });
    expect(JSON.parse(json.stdout)).toEqual({ policies: [] });
    const help = await cli(['--url', 'http://x', '--help', 'policy'], { fetch: noNetwork });
    expect(help.status).toBe(0);
    expect(help.stdout).toContain('quotaplane policy list');
  });

  it.each([
    [['--timeout-ms', '0', 'policy', 'list'], '--timeout-ms needs a whole number > 0'],
    [['--colour', 'policy', 'list'], 'unknown flag "--colour" before the command'],
    [['--url', 'http://x'], 'no command after the flags'],
    [['policy', 'list', '--url'], "Option '--url <value>' argument missing"],
    [['--url', 'http://x', 'stack'], '--url is a flag of the admin commands, not of stack'],
  ])('refuses misplaced or bad global flags: %j exits 2 with "%s"', async (argv, message) => {
    const r = await cli(argv, { fetch: noNetwork });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(message);
    expect(r.stdout).toBe('');
  });

  it('refuses an answer that is not the admin API, and exits 3', async () => {
    const html: typeof fetch = () => Promise.resolve(new Response('<html>', { status: 502 }));
    const r = await cli(['policy', 'list'], { fetch: html });
    expect(r.status).toBe(3);
    expect(r.stderr).toContain('answered 502 without a problem document');
  });

  it("takes another service's problem document (an agent's) for no coordinator: exit 3, not the API refusing", async () => {
    const agent: typeof fetch = () =>
      Promise.resolve(
        new Response(
          JSON.stringify({
            type: 'urn:quotaplane:error:AGT_ERR_NOT_FOUND',
            title: 'Not Found',
            status: 404,
            detail: 'Route GET:/v1/policies not found',
            code: 'AGT_ERR_NOT_FOUND',
          }),
          { status: 404, headers: { 'content-type': 'application/problem+json' } },
        ),
      );
    const r = await cli(['policy', 'list', '--url', 'http://127.0.0.1:9'], { fetch: agent });
    expect(r.status).toBe(3);
    expect(r.stderr).toBe(
      "quotaplane: GET /v1/policies answered 404 with AGT_ERR_NOT_FOUND, not a coordinator's error code (COORD_ERR_*); is http://127.0.0.1:9 a quotaplane coordinator?\n",
    );
    expect(r.stdout).toBe('');
  });

  it('quotes ETags and leaves * and quoted tags alone', () => {
    expect(quoteEtag('3')).toBe('"3"');
    expect(quoteEtag('"3"')).toBe('"3"');
    expect(quoteEtag('*')).toBe('*');
  });

  it('sends derived maxCost and idle TTL back as derived, explicit ones as they are', () => {
    const base = {
      name: 'p',
      kind: 'token_bucket',
      capacity: 10,
      refillPerSecond: 0.5,
      mode: 'regional',
      onStoreFailure: 'closed',
      version: 1,
    } as const;
    expect(storedSpec({ ...base, maxCost: 1, idleTtlSeconds: 60 })).toEqual({
      kind: 'token_bucket',
      capacity: 10,
      refillPerSecond: 0.5,
      mode: 'regional',
      onStoreFailure: 'closed',
      version: 1,
    });
    expect(storedSpec({ ...base, maxCost: 4, idleTtlSeconds: 600 })).toMatchObject({
      maxCost: 4,
      idleTtlSeconds: 600,
    });
  });

  it('aligns tables: text left, numbers right, missing values as —', () => {
    expect(
      table(
        ['NAME', 'N'],
        [
          ['a', 5],
          ['bbb', 100],
          ['c', null],
        ],
      ),
    ).toBe(['NAME    N', 'a       5', 'bbb   100', 'c       —'].join('\n'));
    expect(percent(1 / 3)).toBe('33.33%');
    expect(percent(0.020000000000000004)).toBe('2.00%');
    // Tenths below 10 s, whole seconds from there: 9.96 s is 10s, never 10.0s.
    const now = Date.parse('2030-01-01T00:00:10.000Z');
    expect(relative('2030-01-01T00:00:00.040Z', now)).toBe('10s ago');
    expect(relative('2030-01-01T00:00:00.060Z', now)).toBe('9.9s ago');
    expect(relative('2030-01-01T00:00:22.400Z', now)).toBe('in 12s');
  });

  it('calls a region ok, degraded, down or silent', () => {
    expect(regionHealth(2, 2, '2030-01-01T00:00:00.000Z')).toBe('ok');
    expect(regionHealth(1, 2, '2030-01-01T00:00:00.000Z')).toBe('degraded');
    expect(regionHealth(0, 1, '2030-01-01T00:00:00.000Z')).toBe('down');
    expect(regionHealth(0, 0, null)).toBe('silent');
  });
});
