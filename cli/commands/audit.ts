/**
 * `quotaplane audit [POLICY]`: the audit trail, newest first. Operators' own changes by default, with the number
 * of the rebalancer's share moves left out (`GET /v1/audit?moves=hide`); `--moves` lists the moves too, in a
 * table of their own: one column per region (share before → after), the reason and the demand that moved them.
 */
import { AuditResponse, type AuditEntry, type PolicyView } from '../../core/wire/admin.js';
import { ownValue } from '../../core/own-keys.js';
import type { Context } from '../context.js';
import { parseFlags, positiveInt, positionals, stringFlag } from '../flags.js';
import { percent, relative, table } from '../table.js';

export const AUDIT_USAGE = `usage:
  quotaplane audit [POLICY] [--moves] [--limit N] [--before SEQ]
    operators' changes, newest first, and how many rebalancer moves were left out;
    --moves lists the moves too (one column per region: share before → after)`;

const FIELDS: readonly (readonly [keyof PolicyView, string])[] = [
  ['capacity', 'capacity'],
  ['refillPerSecond', 'refill/s'],
  ['maxCost', 'max cost'],
  ['mode', 'mode'],
  ['homeRegion', 'home'],
  ['onStoreFailure', 'on failure'],
  ['idleTtlSeconds', 'ttl s'],
  ['version', 'key version'],
  ['minShare', 'min share'],
];

/** What a change did, in one cell: the fields it changed (`capacity 40 → 80`), or what was created. */
export function changeText(e: AuditEntry): string {
  if (e.refused !== undefined)
    return `${e.refused.reason}: ${e.refused.method} ${e.refused.route} ×${e.refused.attempts}`;
  if (e.restored !== undefined) return `undid a ${e.restored.operation} in ${e.restored.bucket}`;
  const show = (v: PolicyView[keyof PolicyView]): string =>
    v === undefined || v === null ? '—' : typeof v === 'object' ? JSON.stringify(v) : `${v}`;
  if (e.before === null && e.after !== null)
    return FIELDS.filter(([k]) => e.after![k] !== undefined)
      .slice(0, 2)
      .map(([k, label]) => `${label} ${show(e.after![k])}`)
      .join(', ');
  if (e.before !== null && e.after !== null)
    return FIELDS.filter(([k]) => JSON.stringify(e.before![k]) !== JSON.stringify(e.after![k]))
      .map(([k, label]) => `${label} ${show(e.before![k])} → ${show(e.after![k])}`)
      .join(', ');
  return '';
}

export async function auditCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(
    argv,
    { moves: { type: 'boolean' }, limit: { type: 'string' }, before: { type: 'string' } },
    AUDIT_USAGE,
  );
  if (parsed.help) return (ctx.say(AUDIT_USAGE), 0);
  const names = parsed.positionals.length > 0 ? ['POLICY'] : [];
  const [policy] = positionals(parsed, names, AUDIT_USAGE);
  const limit = stringFlag(parsed.values['limit']);
  const before = stringFlag(parsed.values['before']);
  const showMoves = parsed.values['moves'] === true;
  const q = new URLSearchParams({
    moves: showMoves ? 'show' : 'hide',
    ...(policy !== undefined ? { policy } : {}),
    ...(limit !== undefined ? { limit: String(positiveInt(limit, '--limit', AUDIT_USAGE)) } : {}),
    ...(before !== undefined ? { before: String(positiveInt(before, '--before', AUDIT_USAGE)) } : {}),
  });
  const { body } = await ctx.client.request('GET', `/v1/audit?${q.toString()}`, AuditResponse);
  if (ctx.json) return (ctx.printJson(body), 0);
  const now = ctx.now();
  const changes = body.entries.filter((e) => e.action !== 'move');
  const moves = body.entries.filter((e) => e.action === 'move' && e.move !== undefined);
  ctx.say(
    changes.length === 0
      ? 'no operator changes'
      : table(
          ['SEQ', 'WHEN', 'WHO', 'ACTION', 'POLICY', 'ETAG', 'CHANGE'],
          changes.map((e) => [
            e.seq,
            relative(e.at, now),
            `${e.actor.name} (${e.actor.role})`,
            e.action,
            e.policy,
            e.action === 'refused' || e.action === 'restore' || e.revision === undefined
              ? undefined
              : `"${e.revision}"`,
            changeText(e),
          ]),
        ),
  );
  if (body.movesHidden !== undefined) {
    const n = body.movesHidden;
    ctx.say(`${n} rebalancer ${n === 1 ? 'move' : 'moves'} left out (--moves lists them)`);
  }
  if (moves.length > 0) {
    const regions = [...new Set(moves.flatMap((m) => Object.keys(m.move!.to)))].sort();
    ctx.say('');
    ctx.say(
      table(
        [
          'SEQ',
          'WHEN',
          'POLICY',
          'EPOCH',
          'REASON',
          ...regions.map((r) => r.toUpperCase()),
          ...regions.map((r) => `DEMAND/S ${r.toUpperCase()}`),
        ],
        moves.map((e) => {
          const m = e.move!;
          return [
            e.seq,
            relative(e.at, now),
            e.policy,
            m.epoch,
            m.reason,
            ...regions.map(
              (r) =>
                `${m.from === null ? '' : `${percent(ownValue(m.from, r) ?? 0)} → `}${percent(ownValue(m.to, r) ?? 0)}`,
            ),
            ...regions.map((r) => ownValue(m.demand, r)),
          ];
        }),
      ),
    );
  }
  if (body.next !== null) ctx.say(`older: --before ${body.next}`);
  return 0;
}
