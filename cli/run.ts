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
import { BACKUP_USAGE, RESTORE_USAGE, backupCommand, restoreCommand } from './commands/backup.js';
import { EXPLAIN_USAGE, explainCommand } from './commands/explain.js';
import { simulateCommand, stackCommand } from './commands/local.js';
import { BUDGET_USAGE, POLICY_USAGE, budgetCommand, policyCommand } from './commands/policy.js';
import { Context, UsageError, type GlobalFlags, type Io } from './context.js';
import { GLOBAL_OPTIONS } from './flags.js';

export const EXIT = { ok: 0, refused: 1, usage: 2, unreachable: 3 } as const;

export const USAGE = `quotaplane: operate a quotaplane coordinator

usage: quotaplane COMMAND [flags]

commands:
  policy list|get|put|patch|delete   read and change policies (ETags handled)
  budget set NAME                    change a policy's capacity and refill
  allocations [POLICY]               shares, leases and overrides per region
  agents                             regions, agents, health and lease state
  explain POLICY SUBJECT             per region: share, limit, tokens left, why a refusal
  backup [--out FILE]                policies and audit trail as one JSON document
  restore FILE|-                     a backup into a coordinator that holds no policies
  simulate [flags]                   the overshoot simulator (npm run simulate)
  stack [--any-ports]                the local three-region stack (npm start)

flags of every command:
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
  backup: { run: backupCommand, usage: BACKUP_USAGE },
  restore: { run: restoreCommand, usage: RESTORE_USAGE },
  simulate: { run: simulateCommand },
  stack: { run: stackCommand },
};

/** Global flags seen anywhere on the line, read before the command parses its own. */
function globalFlags(argv: readonly string[]): GlobalFlags {
  const value = (name: string): string | undefined => {
    for (let i = 0; i < argv.length; i++) {
      const a = argv[i]!;
      if (a === `--${name}`) return argv[i + 1];
      if (a.startsWith(`--${name}=`)) return a.slice(name.length + 3);
    }
    return undefined;
  };
  const url = value('url');
  const token = value('token');
  const timeout = value('timeout-ms');
  return {
    json: argv.includes('--json'),
    ...(url !== undefined ? { url } : {}),
    ...(token !== undefined ? { token } : {}),
    ...(timeout !== undefined && Number.isInteger(Number(timeout)) && Number(timeout) > 0
      ? { timeoutMs: Number(timeout) }
      : {}),
  };
}

export async function run(argv: readonly string[], io: Io): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    io.stdout(`${USAGE}\n`);
    return name === undefined ? EXIT.usage : EXIT.ok;
  }
  const command = ownValue(COMMANDS, name);
  if (command === undefined) {
    io.stderr(`quotaplane: unknown command "${name}"\n\n${USAGE}\n`);
    return EXIT.usage;
  }
  if (command.usage !== undefined && (rest.includes('--help') || rest.includes('-h'))) {
    io.stdout(`${command.usage}\n`);
    return EXIT.ok;
  }
  const ctx = new Context(io, command.usage === undefined ? { json: false } : globalFlags(rest));
  try {
    return await command.run(ctx, rest);
  } catch (error) {
    if (error instanceof UsageError) {
      io.stderr(`quotaplane: ${error.message}\n${error.usage === undefined ? '' : `\n${error.usage}\n`}`);
      return EXIT.usage;
    }
    if (error instanceof AdminApiError) {
      const fields = error.fieldErrors.map((f) => `  - ${f.path === '' ? '(body)' : f.path}: ${f.message}\n`);
      // With field problems, the detail repeats them on one line: print its lead, then one problem per line.
      const detail = fields.length > 0 ? error.detail.split(': ')[0]! : error.detail;
      io.stderr(`quotaplane: ${error.code} (${error.status}): ${detail}\n${fields.join('')}`);
      return EXIT.refused;
    }
    if (error instanceof ConnectionError) {
      io.stderr(`quotaplane: ${error.message}\n`);
      return EXIT.unreachable;
    }
    throw error;
  }
}

export { GLOBAL_OPTIONS };
