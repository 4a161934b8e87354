/**
 * The `quotaplane` command: one function from argv to an exit status, so tests run it in process against a real
 * coordinator. Exit status: 0 done, 1 the API refused (its code is printed), 2 a mistake in the command line,
 * 3 the coordinator could not be reached or did not answer its API.
 */
import { ownValue } from '../core/own-keys.js';
import { AdminApiError, ConnectionError } from './admin-client.js';
import {
  AGENTS_USAGE,
  ALLOCATIONS_USAGE,
  agentsCommand,
  allocationsCommand,
} from './commands/allocations.js';
import { AUDIT_USAGE, auditCommand } from './commands/audit.js';
import { BACKUP_USAGE, RESTORE_USAGE, backupCommand, restoreCommand } from './commands/backup.js';
import { EXPLAIN_USAGE, explainCommand } from './commands/explain.js';
import { simulateCommand, stackCommand } from './commands/local.js';
import { BUDGET_USAGE, POLICY_USAGE, budgetCommand, policyCommand } from './commands/policy.js';
import { Context, NotFoundError, UsageError, type GlobalFlags, type Io } from './context.js';
import { GLOBAL_OPTIONS, parseFlags } from './flags.js';

export const EXIT = { ok: 0, refused: 1, usage: 2, unreachable: 3 } as const;

export const USAGE = `quotaplane: operate a quotaplane coordinator

usage: quotaplane [flags] COMMAND [flags]

commands:
  policy list|get|put|patch|delete   read and change policies (ETags handled)
  budget set NAME                    change a policy's capacity and refill
  allocations [POLICY]               shares, leases and overrides per region
  agents                             regions, agents, health and lease state
  explain POLICY SUBJECT             per region: share, limit, tokens left, why a refusal
  audit [POLICY] [--moves]           operators' changes, newest first; the rebalancer's moves counted
  backup [--out FILE]                policies and audit trail as one JSON document
  restore FILE|-                     a backup into a coordinator that holds no policies
  simulate [flags]                   the overshoot simulator (npm run simulate)
  stack [--any-ports]                the local three-region stack (npm start)

flags of every command (before or after it):
  --url URL        admin API (default $QUOTAPLANE_URL, else http://127.0.0.1:7100)
  --token TOKEN    bearer token (default $QUOTAPLANE_TOKEN, else $QP_ADMIN_TOKEN, else $QP_READ_TOKEN)
  --json           print the API's JSON instead of tables
  --timeout-ms N   give up on the coordinator after N ms (default 10000)
  --help           this text, or a command's usage

exit status: 0 done, 1 refused by the API, 2 bad command line, 3 coordinator unreachable`;

type Command = (ctx: Context, argv: readonly string[]) => Promise<number>;

/** Each command, and its usage (printed on --help; `simulate` and `stack` print their own). */
const COMMANDS: Record<string, { run: Command; usage?: string }> = {
  policy: { run: policyCommand, usage: POLICY_USAGE },
  policies: { run: policyCommand, usage: POLICY_USAGE },
  budget: { run: budgetCommand, usage: BUDGET_USAGE },
  allocations: { run: allocationsCommand, usage: ALLOCATIONS_USAGE },
  agents: { run: agentsCommand, usage: AGENTS_USAGE },
  explain: { run: explainCommand, usage: EXPLAIN_USAGE },
  audit: { run: auditCommand, usage: AUDIT_USAGE },
  backup: { run: backupCommand, usage: BACKUP_USAGE },
  restore: { run: restoreCommand, usage: RESTORE_USAGE },
  simulate: { run: simulateCommand },
  stack: { run: stackCommand },
};

/** Global flags that take a value (`--url URL` or `--url=URL`). */
const VALUED_GLOBALS = new Set(['--url', '--token', '--timeout-ms']);
const BARE_GLOBALS = new Set(['--json', '--help', '-h']);

function isGlobal(arg: string): boolean {
  const name = arg.includes('=') ? arg.slice(0, arg.indexOf('=')) : arg;
  return VALUED_GLOBALS.has(name) || (BARE_GLOBALS.has(arg) && !arg.includes('='));
}

/**
 * Global flags anywhere on the line (`quotaplane --url U policy list`, `quotaplane policy --json list`): taken
 * out with their values, and the command's own words kept in order. Everything after `--` is left alone.
 */
export function splitGlobals(argv: readonly string[]): { globals: string[]; words: string[] } {
  const globals: string[] = [];
  const words: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      words.push(...argv.slice(i));
      break;
    }
    if (!isGlobal(a)) words.push(a);
    else if (VALUED_GLOBALS.has(a) && i + 1 < argv.length) globals.push(a, argv[++i]!);
    else globals.push(a);
  }
  return { globals, words };
}

/** The command's name: the first word, after any global flags (`--url U` consumes its value). */
function commandAt(argv: readonly string[]): number {
  let i = 0;
  while (i < argv.length && isGlobal(argv[i]!)) i += VALUED_GLOBALS.has(argv[i]!) ? 2 : 1;
  return i;
}

export async function run(argv: readonly string[], io: Io): Promise<number> {
  const at = commandAt(argv);
  const name = argv[at];
  const leading = argv.slice(0, Math.min(at, argv.length));
  const help = (args: readonly string[]) => args.includes('--help') || args.includes('-h');
  if (name === 'help' || (name === undefined && help(leading))) {
    // `quotaplane help policy`: that command's usage, as `quotaplane policy --help` prints it.
    const topic = name === 'help' ? argv[at + 1] : undefined;
    const about = topic === undefined ? undefined : ownValue(COMMANDS, topic);
    if (about !== undefined && about.usage !== undefined) {
      io.stdout(`${about.usage}\n`);
      return EXIT.ok;
    }
    if (about !== undefined) return await about.run(new Context(io, { json: false }), ['--help']);
    io.stdout(`${USAGE}\n`);
    return EXIT.ok;
  }
  if (name === undefined) {
    if (leading.length === 0) io.stdout(`${USAGE}\n`);
    else io.stderr(`quotaplane: no command after the flags\n\n${USAGE}\n`);
    return EXIT.usage;
  }
  const command = ownValue(COMMANDS, name);
  if (command === undefined) {
    io.stderr(
      `quotaplane: ${name.startsWith('-') ? `unknown flag "${name}" before the command` : `unknown command "${name}"`}\n\n${USAGE}\n`,
    );
    return EXIT.usage;
  }
  const after = argv.slice(at + 1);
  if (command.usage === undefined) {
    // `simulate` and `stack` parse their own flags: only --help may come before their name.
    const stray = leading.find((a) => a !== '--help' && a !== '-h');
    if (stray !== undefined) {
      io.stderr(`quotaplane: ${stray.split('=')[0]!} is a flag of the admin commands, not of ${name}\n`);
      return EXIT.usage;
    }
    const ctx = new Context(io, { json: false });
    return await command.run(ctx, help(leading) ? ['--help', ...after] : after).catch((error: unknown) => {
      if (error instanceof UsageError) return usageFailed(io, error);
      throw error;
    });
  }
  const { globals, words } = splitGlobals([...leading, ...after]);
  if (help(globals)) {
    io.stdout(`${command.usage}\n`);
    return EXIT.ok;
  }
  // The command parses its words with the global flags put back at the end, so they are checked in one place.
  const rest = [...words, ...globals];
  let flags: GlobalFlags;
  try {
    flags = parseFlags(globals, {}, command.usage).global;
  } catch (error) {
    if (error instanceof UsageError) return usageFailed(io, error);
    throw error;
  }
  const ctx = new Context(io, flags);
  try {
    return await command.run(ctx, rest);
  } catch (error) {
    if (error instanceof UsageError) return usageFailed(io, error);
    if (error instanceof AdminApiError) {
      const fields = error.fieldErrors.map((f) => `  - ${f.path === '' ? '(body)' : f.path}: ${f.message}\n`);
      // With field problems, the detail repeats them on one line: print its lead, then one problem per line.
      const detail = fields.length > 0 ? error.detail.split(': ')[0]! : error.detail;
      io.stderr(`quotaplane: ${error.code} (${error.status}): ${detail}\n${fields.join('')}`);
      return EXIT.refused;
    }
    if (error instanceof NotFoundError) {
      io.stderr(`quotaplane: ${error.message}\n`);
      return EXIT.refused;
    }
    if (error instanceof ConnectionError) {
      io.stderr(`quotaplane: ${error.message}\n`);
      return EXIT.unreachable;
    }
    throw error;
  }
}

function usageFailed(io: Io, error: UsageError): number {
  io.stderr(`quotaplane: ${error.message}\n${error.usage === undefined ? '' : `\n${error.usage}\n`}`);
  return EXIT.usage;
}

export { GLOBAL_OPTIONS };
