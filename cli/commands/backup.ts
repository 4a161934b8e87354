/**
 * `quotaplane backup [--out FILE]` and `quotaplane restore FILE|-`: the coordinator's policies and audit trail
 * out as one JSON document (`GET /v1/backup`), and back into an empty coordinator (`POST /v1/restore`).
 */
import { readFile, writeFile } from 'node:fs/promises';
import { Backup, RestoreResult } from '../../core/wire/backup.js';
import { UsageError, type Context } from '../context.js';
import { parseFlags, positionals } from '../flags.js';

export const BACKUP_USAGE = `usage:
  quotaplane backup [--out FILE]     policies and audit trail as one JSON document (default: standard output)`;

export const RESTORE_USAGE = `usage:
  quotaplane restore FILE|-          restore a backup into a coordinator that holds no policies
                                     (a bad or partial file is refused whole: nothing is written)`;

export async function backupCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(argv, { out: { type: 'string' } }, BACKUP_USAGE);
  if (parsed.help) return (ctx.say(BACKUP_USAGE), 0);
  positionals(parsed, [], BACKUP_USAGE);
  const { body } = await ctx.client.request('GET', '/v1/backup', Backup);
  const out = parsed.values['out'];
  const text = JSON.stringify(body, null, 2);
  if (typeof out !== 'string' || out === '-') return (ctx.say(text), 0);
  try {
    await writeFile(out, `${text}\n`, { mode: 0o600 });
  } catch (error) {
    throw new UsageError(`cannot write ${out}: ${(error as Error).message}`, BACKUP_USAGE);
  }
  const summary = { file: out, policies: body.policies.length, audit: body.audit.length };
  if (ctx.json) return (ctx.printJson(summary), 0);
  ctx.say(`wrote ${out}: ${summary.policies} policies, ${summary.audit} audit records`);
  return 0;
}

export async function restoreCommand(ctx: Context, argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(argv, {}, RESTORE_USAGE);
  if (parsed.help) return (ctx.say(RESTORE_USAGE), 0);
  const [file] = positionals(parsed, ['FILE'], RESTORE_USAGE);
  let text: string;
  if (file === '-') {
    if (ctx.io.stdin === undefined) throw new UsageError('restore - needs standard input', RESTORE_USAGE);
    text = await ctx.io.stdin();
  } else {
    try {
      text = await readFile(file!, 'utf8');
    } catch (error) {
      throw new UsageError(`cannot read ${file!}: ${(error as Error).message}`, RESTORE_USAGE);
    }
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new UsageError(
      `${file!} is not JSON (a partial file?): ${(error as Error).message}`,
      RESTORE_USAGE,
    );
  }
  // The coordinator checks the document whole and answers every problem; nothing is checked twice here.
  const { body } = await ctx.client.request('POST', '/v1/restore', RestoreResult, { body: value });
  if (ctx.json) return (ctx.printJson(body), 0);
  ctx.say(`restored ${body.policies} policies and ${body.audit} audit records`);
  return 0;
}
