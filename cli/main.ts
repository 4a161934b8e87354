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

// Standard output may be a pipe whose reader left before the end (`quotaplane audit | head -1`): a write to it
// fails with EPIPE, which unhandled crashed the command with a stack trace and exit 1 ("the API refused"). The
// reader had what it wanted: the rest of the output is dropped and the command ends as it would have (0 when
// it did its work). Any other failure to write is dropped as well, as scripts/stack.ts does.
const closed = new Set<NodeJS.WriteStream>();
for (const stream of [process.stdout, process.stderr])
  stream.on('error', () => {
    closed.add(stream);
  });
const writeTo = (stream: NodeJS.WriteStream) => (text: string) => {
  if (!closed.has(stream)) stream.write(text);
};

const status = await run(process.argv.slice(2), {
  env: process.env,
  stdout: writeTo(process.stdout),
  stderr: writeTo(process.stderr),
  stdin: readStdin,
  root: fileURLToPath(new URL('..', import.meta.url)),
}).catch((error: unknown) => {
  writeTo(process.stderr)(
    `quotaplane: unexpected failure: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
  );
  return 1;
});
process.exitCode = status;
