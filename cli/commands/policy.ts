/**
 * `quotaplane policy list|get|put|patch|delete` and `quotaplane budget set`: the policy routes of the admin API,
 * with ETags handled: every write is conditional on the version the command read (or on the ETag given with
 * `--if-match`), so two operators editing at once never overwrite each other silently.
 */
import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { PolicyList, PolicyView } from '../../core/wire/admin.js';
import { kindOf } from '../../core/kinds/index.js';
import { Policy } from '../../core/policy/policy.js';
import { ownValue, setOwn } from '../../core/own-keys.js';
import { AdminApiError } from '../admin-client.js';
import { UsageError, type Context } from '../context.js';
import { numberFlag, parseFlags, positionals, stringFlag, type Parsed } from '../flags.js';
import { record, table } from '../table.js';

export const POLICY_USAGE = `usage:
  quotaplane policy list
  quotaplane policy get NAME
  quotaplane policy put NAME (--capacity N --refill N [field flags] | --file FILE|-) [--create | --if-match ETAG]
  quotaplane policy patch NAME [field flags] [--if-match ETAG]
  quotaplane policy delete NAME [--if-match ETAG]

field flags: --capacity N  --refill N (tokens/s)  --max-cost N  --mode regional|strict|local
             --home-region R  --on-store-failure closed|open|local  --idle-ttl SECONDS
             --key-version N  --min-share S`;

export const BUDGET_USAGE = `usage:
  quotaplane budget set NAME [--capacity N] [--refill N] [--if-match ETAG]`;

const FIELD_OPTIONS = {
  capacity: { type: 'string' },
  refill: { type: 'string' },
  'max-cost': { type: 'string' },
  mode: { type: 'string' },
  'home-region': { type: 'string' },
  'on-store-failure': { type: 'string' },
  'idle-ttl': { type: 'string' },
  'key-version': { type: 'string' },
  'min-share': { type: 'string' },
} as const;

type Spec = Record<string, unknown>;

/** The policy fields given as flags, as the API names them. */
function fieldsFrom(parsed: Parsed, usage: string): Spec {
  const v = parsed.values;
  const out: Spec = {};
  const num = (flag: string, field: string) => {
    const n = numberFlag(ownValue(v, flag), `--${flag}`, usage);
    if (n !== undefined) setOwn(out, field, n);
  };
  const str = (flag: string, field: string) => {
    const s = stringFlag(ownValue(v, flag));
    if (s !== undefined) setOwn(out, field, s);
  };
  num('capacity', 'capacity');
  num('refill', 'refillPerSecond');
  num('max-cost', 'maxCost');
  str('mode', 'mode');
  str('home-region', 'homeRegion');
  str('on-store-failure', 'onStoreFailure');
  num('idle-ttl', 'idleTtlSeconds');
  num('key-version', 'version');
  num('min-share', 'minShare');
  return out;
}

/** `3` or `"3"` → `"3"`; `*` stays. */
export function quoteEtag(tag: string): string {
  const t = tag.trim();
  if (t === '*' || /^(W\/)?".*"$/.test(t)) return t;
  return `"${t}"`;
}

const path = (name: string) => `/v1/policies/${encodeURIComponent(name)}`;

/** The policy and its ETag, or undefined when it does not exist. */
async function current(
  ctx: Context,
  name: string,
): Promise<{ policy: PolicyView; etag: string } | undefined> {
  try {
    const got = await ctx.client.request('GET', path(name), PolicyView);
    return { policy: got.body, etag: got.etag ?? '' };
  } catch (error) {
    if (error instanceof AdminApiError && error.code === 'COORD_ERR_POLICY_NOT_FOUND') return undefined;
    throw error;
  }
}

function policyRecord(p: PolicyView, etag?: string): string {
  return record([
    ['name', p.name],
    ['capacity', p.capacity],
    ['refill/s', p.refillPerSecond],
    ['max cost', p.maxCost],
    ['mode', p.mode],
    ['home region', p.homeRegion],
    ['on store failure', p.onStoreFailure],
    ['idle ttl (s)', p.idleTtlSeconds],
    ['key version', p.version],
    ['min share', p.minShare],
    ...(etag !== undefined ? ([['etag (revision)', etag]] as const) : []),
  ]);
}

/** What a write printed: the stored policy, its new ETag and what happened. */
function written(ctx: Context, verb: string, policy: PolicyView, etag: string | undefined): void {
  if (ctx.json) return ctx.printJson({ result: verb, etag: etag ?? null, policy });
  ctx.say(`${verb} policy "${policy.name}" (ETag ${etag ?? '—'})`);
  ctx.say(policyRecord(policy));
}

/** A 412 after the command read the policy itself: someone wrote in between. */
function raced(error: unknown, name: string, explicit: boolean): never {
  if (!explicit && error instanceof AdminApiError && error.code === 'COORD_ERR_PRECONDITION_FAILED') {
    throw new AdminApiError(error.status, {
      type: 'urn:quotaplane:problem:coord-err-precondition-failed',
      title: 'Precondition Failed',
      status: error.status,
      code: error.code,
      detail: `policy "${name}" changed since this command read it (${error.detail}); nothing was written, run it again to apply to the new version`,
    });
  }
  throw error;
}

async function readSpecFile(ctx: Context, file: string, usage: string): Promise<Spec> {
  let text: string;
  if (file === '-') {
    if (ctx.io.stdin === undefined) throw new UsageError('--file - needs standard input', usage);
    text = await ctx.io.stdin();
  } else {
    try {
      text = await readFile(file, 'utf8');
    } catch (error) {
      throw new UsageError(`cannot read ${file}: ${(error as Error).message}`, usage);
    }
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`${file} is not JSON: ${(error as Error).message}`, usage);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new UsageError(`${file} must hold one JSON object: the policy's fields`, usage);
  }
  return value as Spec;
}

export async function policyCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const [sub, ...rest] = argv;
  const usage = POLICY_USAGE;
  switch (sub) {
    case 'list': {
      const parsed = parseFlags(rest, {}, usage);
      positionals(parsed, [], usage);
      const { body } = await ctx.client.request('GET', '/v1/policies', PolicyList);
      if (ctx.json) return (ctx.printJson(body), 0);
      ctx.say(
        body.policies.length === 0
          ? 'no policies'
          : table(
              [
                'NAME',
                'CAPACITY',
                'REFILL/S',
                'MAX COST',
                'MODE',
                'HOME',
                'ON FAILURE',
                'TTL S',
                'KEY VERSION',
              ],
              body.policies.map((p) => [
                p.name,
                p.capacity,
                p.refillPerSecond,
                p.maxCost,
                p.mode,
                p.homeRegion,
                p.onStoreFailure,
                p.idleTtlSeconds,
                p.version,
              ]),
            ),
      );
      return 0;
    }
    case 'get': {
      const parsed = parseFlags(rest, {}, usage);
      const [name] = positionals(parsed, ['NAME'], usage);
      const got = await ctx.client.request('GET', path(name!), PolicyView);
      if (ctx.json) return (ctx.printJson({ etag: got.etag ?? null, policy: got.body }), 0);
      ctx.say(policyRecord(got.body, got.etag));
      return 0;
    }
    case 'put': {
      const parsed = parseFlags(
        rest,
        {
          ...FIELD_OPTIONS,
          file: { type: 'string' },
          create: { type: 'boolean' },
          'if-match': { type: 'string' },
        },
        usage,
      );
      const [name] = positionals(parsed, ['NAME'], usage);
      const fields = fieldsFrom(parsed, usage);
      const file = stringFlag(parsed.values['file']);
      if (file !== undefined && Object.keys(fields).length > 0) {
        throw new UsageError('give the policy either as field flags or as --file, not both', usage);
      }
      const body = file !== undefined ? await readSpecFile(ctx, file, usage) : fields;
      if (Object.keys(body).length === 0) throw new UsageError('no policy fields given', usage);
      const ifMatch = stringFlag(parsed.values['if-match']);
      const create = parsed.values['create'] === true;
      if (create && ifMatch !== undefined)
        throw new UsageError('--create and --if-match exclude each other', usage);
      let condition: { ifMatch?: string; ifNoneMatch?: string };
      if (create) condition = { ifNoneMatch: '*' };
      else if (ifMatch !== undefined) condition = { ifMatch: quoteEtag(ifMatch) };
      else {
        const now = await current(ctx, name!);
        condition = now === undefined ? { ifNoneMatch: '*' } : { ifMatch: now.etag };
      }
      const explicit = create || ifMatch !== undefined;
      const answer = await ctx.client
        .request('PUT', path(name!), PolicyView, { body, ...condition })
        .catch((error: unknown) => raced(error, name!, explicit));
      const verb = answer.status === 201 ? 'created' : 'stored';
      written(ctx, verb, answer.body, answer.etag);
      return 0;
    }
    case 'patch': {
      const parsed = parseFlags(rest, { ...FIELD_OPTIONS, 'if-match': { type: 'string' } }, usage);
      const [name] = positionals(parsed, ['NAME'], usage);
      const fields = fieldsFrom(parsed, usage);
      if (Object.keys(fields).length === 0) throw new UsageError('no field to change', usage);
      const now = await current(ctx, name!);
      if (now === undefined) {
        throw new AdminApiError(404, {
          type: 'urn:quotaplane:problem:coord-err-policy-not-found',
          title: 'Not Found',
          status: 404,
          code: 'COORD_ERR_POLICY_NOT_FOUND',
          detail: `policy "${name!}" does not exist; create it with quotaplane policy put`,
        });
      }
      const ifMatch = stringFlag(parsed.values['if-match']);
      const answer = await ctx.client
        .request('PUT', path(name!), PolicyView, {
          body: { ...storedSpec(now.policy), ...fields },
          ifMatch: ifMatch === undefined ? now.etag : quoteEtag(ifMatch),
        })
        .catch((error: unknown) => raced(error, name!, ifMatch !== undefined));
      written(ctx, 'stored', answer.body, answer.etag);
      return 0;
    }
    case 'delete': {
      const parsed = parseFlags(rest, { 'if-match': { type: 'string' } }, usage);
      const [name] = positionals(parsed, ['NAME'], usage);
      const given = stringFlag(parsed.values['if-match']);
      const ifMatch = given !== undefined ? quoteEtag(given) : (await current(ctx, name!))?.etag;
      if (ifMatch === undefined) {
        // Let the API say it: the same code and message as any other client gets.
        await ctx.client.request('DELETE', path(name!), undefined);
      } else {
        await ctx.client
          .request('DELETE', path(name!), undefined, { ifMatch })
          .catch((error: unknown) => raced(error, name!, given !== undefined));
      }
      if (ctx.json) return (ctx.printJson({ result: 'deleted', policy: name }), 0);
      ctx.say(`deleted policy "${name!}"`);
      return 0;
    }
    case undefined:
      throw new UsageError('missing a policy command', usage);
    case 'help':
      ctx.say(usage);
      return 0;
    default:
      throw new UsageError(`unknown policy command "${sub}"`, usage);
  }
}

/**
 * The spec to send back when changing some fields: the stored policy without its name, and without `maxCost`
 * or `idleTtlSeconds` when they equal what the budget derives, so they keep following later budget changes.
 */
export function storedSpec(p: PolicyView): Spec {
  const { name: _name, ...spec } = p;
  const out: Spec = { ...spec };
  // A log kind's rate follows its capacity and window (or lease): sending it back would pin a stale one.
  if (kindOf(p.kind).rate !== 'declared') delete out['refillPerSecond'];
  if (p.maxCost === Math.min(1, p.capacity)) delete out['maxCost'];
  if (p.classes !== undefined) {
    // Derived class fields are left out as the policy's own are, so a PUT of the spec is accepted as it was.
    const classes: Record<string, Record<string, number>> = {};
    for (const [name, c] of Object.entries(p.classes)) {
      const spec: Record<string, number> = { ...c };
      if (kindOf(p.kind).rate !== 'declared') delete spec['refillPerSecond'];
      if (c.maxCost === Math.min(1, c.capacity)) delete spec['maxCost'];
      setOwn(classes, name, spec);
    }
    out['classes'] = classes;
  }
  // The TTL the policy derives without one of its own: its slowest class's, its kind's least (a day's), from its
  // exact rate (answers show a derived rate rounded). Equal to it, the TTL is derived and stays so.
  const { idleTtlSeconds: _ttl, ...rest } = out;
  const derived = Policy.safeParse({ name: p.name, ...rest });
  if (derived.success && derived.data.idleTtlSeconds === p.idleTtlSeconds) delete out['idleTtlSeconds'];
  return out;
}

const BudgetFlags = z.object({ capacity: z.number().optional(), refillPerSecond: z.number().optional() });

export async function budgetCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const [sub, ...rest] = argv;
  const usage = BUDGET_USAGE;
  if (sub === undefined) throw new UsageError('missing a budget command', usage);
  if (sub === 'help') return (ctx.say(usage), 0);
  if (sub !== 'set') throw new UsageError(`unknown budget command "${sub}"`, usage);
  const parsed = parseFlags(
    rest,
    { capacity: { type: 'string' }, refill: { type: 'string' }, 'if-match': { type: 'string' } },
    usage,
  );
  const [name] = positionals(parsed, ['NAME'], usage);
  const patch = BudgetFlags.parse({
    capacity: numberFlag(parsed.values['capacity'], '--capacity', usage),
    refillPerSecond: numberFlag(parsed.values['refill'], '--refill', usage),
  });
  if (patch.capacity === undefined && patch.refillPerSecond === undefined) {
    throw new UsageError('give --capacity, --refill or both', usage);
  }
  const given = stringFlag(parsed.values['if-match']);
  // The budget before, read just before the write. With --if-match it is the version the write replaces only when
  // its ETag is the one given (a different one makes the write a 412); otherwise BEFORE stays unknown.
  const read = await current(ctx, name!);
  const ifMatch = given !== undefined ? quoteEtag(given) : read?.etag;
  const before = given === undefined || ifMatch === '*' || read?.etag === ifMatch ? read : undefined;
  const answer = await ctx.client
    .request('PATCH', `${path(name!)}/budget`, PolicyView, {
      body: Object.fromEntries(Object.entries(patch).filter(([, v]) => v !== undefined)),
      ...(ifMatch !== undefined ? { ifMatch } : {}),
    })
    .catch((error: unknown) => raced(error, name!, given !== undefined));
  const after = answer.body;
  if (ctx.json) {
    ctx.printJson({
      result: 'budget',
      etag: answer.etag ?? null,
      before: before?.policy ?? null,
      policy: after,
    });
    return 0;
  }
  ctx.say(`budget of "${after.name}" set (ETag ${answer.etag ?? '—'})`);
  const b = before?.policy;
  ctx.say(
    table(
      ['FIELD', 'BEFORE', 'AFTER'],
      [
        ['capacity', b?.capacity, after.capacity],
        ['refill/s', b?.refillPerSecond, after.refillPerSecond],
        ['max cost', b?.maxCost, after.maxCost],
        ['idle ttl (s)', b?.idleTtlSeconds, after.idleTtlSeconds],
      ],
    ),
  );
  return 0;
}
