/**
 * Entry point of the `quotaplane` command (bin/quotaplane.mjs loads it): the only file of cli/ that reads the
 * process's argv, environment and standard streams, and exits.
 */
import { fileURLToPath } from 'node:url';
import { run } from './run.js';

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

const status = await run(process.argv.slice(2), {
  env: process.env,
  stdout: (text) => process.stdout.write(text),
  stderr: (text) => process.stderr.write(text),
  stdin: readStdin,
  root: fileURLToPath(new URL('..', import.meta.url)),
}).catch((error: unknown) => {
  process.stderr.write(
    `quotaplane: unexpected failure: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
  );
  return 1;
});
process.exitCode = status;
