/**
 * `quotaplane allocations [POLICY]` and `quotaplane agents`: what the coordinator's protocol engine holds, as
 * tables (one row per policy and region; one row per agent) or as the API's JSON.
 */
import { AllocationsResponse, RegionsResponse } from '../../core/wire/admin.js';
import { ownValue } from '../../core/own-keys.js';
import { NotFoundError, UsageError, type Context } from '../context.js';
import { parseFlags, positionals } from '../flags.js';
import { percent, relative, table } from '../table.js';

export const ALLOCATIONS_USAGE = `usage:
  quotaplane allocations [POLICY]`;

export const AGENTS_USAGE = `usage:
  quotaplane agents [--region R]`;

export async function allocationsCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(argv, {}, ALLOCATIONS_USAGE);
  if (parsed.help) return (ctx.say(ALLOCATIONS_USAGE), 0);
  if (parsed.positionals.length > 1) {
    throw new UsageError(`unexpected argument "${parsed.positionals[1]!}"`, ALLOCATIONS_USAGE);
  }
  const only = parsed.positionals[0];
  const { body } = await ctx.client.request('GET', '/v1/allocations', AllocationsResponse);
  const policies = only === undefined ? body.policies : body.policies.filter((p) => p.policy === only);
  if (only !== undefined && policies.length === 0) {
    throw new NotFoundError(`the coordinator holds no allocation of policy "${only}"`);
  }
  if (ctx.json) return (ctx.printJson({ policies }), 0);
  if (policies.length === 0) return (ctx.say('no allocations'), 0);
  const now = ctx.now();
  const rows = policies.flatMap((p) =>
    Object.entries(p.shares).map(([region, share]) => {
      const lease = ownValue(p.leases, region);
      const r = ownValue(p.regions, region);
      return [
        p.policy,
        p.epoch,
        region,
        percent(share),
        r?.pending == null ? undefined : percent(r.pending),
        r?.capacity,
        r?.refillPerSecond,
        r?.demandPerSecond,
        r?.admittedPerSecond,
        r?.refusedPerSecond,
        lease === undefined ? undefined : relative(lease.expiresAt, now),
        lease?.acked,
        r === undefined ? undefined : r.lease.holders.join(','),
        r === undefined ? undefined : relative(r.lease.renewedAt, now),
      ];
    }),
  );
  ctx.say(
    table(
      [
        'POLICY',
        'EPOCH',
        'REGION',
        'SHARE',
        'PENDING',
        'CAPACITY',
        'REFILL/S',
        'DEMAND/S',
        'ADMITTED/S',
        'REFUSED/S',
        'LEASE ENDS',
        'ACKED',
        'HOLDERS',
        'RENEWED',
      ],
      rows,
    ),
  );
  const moves = policies.flatMap((p) => p.moves ?? []);
  if (only !== undefined && moves.length > 0) {
    const regions = Object.keys(policies[0]!.shares);
    ctx.say('');
    ctx.say('latest moves:');
    ctx.say(
      table(
        ['WHEN', 'EPOCH', 'REASON', ...regions.map((r) => r.toUpperCase())],
        moves.map((m) => [
          relative(m.at, now),
          m.epoch,
          m.reason,
          ...regions.map(
            (r) =>
              `${m.from === null ? '' : `${percent(ownValue(m.from, r) ?? 0)} → `}${percent(ownValue(m.to, r) ?? 0)}`,
          ),
        ]),
      ),
    );
  }
  return 0;
}

export async function agentsCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(argv, { region: { type: 'string' } }, AGENTS_USAGE);
  if (parsed.help) return (ctx.say(AGENTS_USAGE), 0);
  positionals(parsed, [], AGENTS_USAGE);
  const only = parsed.values['region'];
  const { body } = await ctx.client.request('GET', '/v1/regions', RegionsResponse);
  const regions = typeof only === 'string' ? body.regions.filter((r) => r.region === only) : body.regions;
  if (typeof only === 'string' && regions.length === 0) {
    throw new NotFoundError(
      `"${only}" is not a configured region (${body.regions.map((r) => r.region).join(', ')})`,
    );
  }
  if (ctx.json) return (ctx.printJson({ regions }), 0);
  const now = ctx.now();
  ctx.say(
    table(
      ['REGION', 'AGENTS', 'LAST REPORT', 'REPORT LAG MS', 'HEALTH'],
      regions.map((r) => [
        r.region,
        r.agents,
        relative(r.lastReportAt, now),
        r.reportLagMs === null ? null : Math.round(r.reportLagMs),
        regionHealth(r.agents, (r.agentDetails ?? []).length, r.lastReportAt),
      ]),
    ),
  );
  const agents = regions.flatMap((r) => (r.agentDetails ?? []).map((a) => ({ region: r.region, ...a })));
  if (agents.length > 0) {
    ctx.say('');
    ctx.say(
      table(
        ['REGION', 'INSTANCE', 'AGENT ID', 'HEARTBEAT', 'LEASE UNTIL', 'APPLIED REV', 'ACKED REV', 'LEASE'],
        agents.map((a) => [
          a.region,
          a.instance,
          a.agentId,
          relative(a.lastHeartbeatAt, now),
          relative(a.leaseUntil, now),
          a.appliedRevision,
          a.ackRevision,
          a.lapsed ? 'lapsed' : 'live',
        ]),
      ),
    );
  }
  return 0;
}

/** `ok` with every known agent live, `degraded` with some lapsed, `down` with none live, `silent` never heard. */
export function regionHealth(live: number, known: number, lastReportAt: string | null): string {
  if (lastReportAt === null && known === 0) return 'silent';
  if (live === 0) return 'down';
  return live < known ? 'degraded' : 'ok';
}
