/**
 * One child process of the stack: started in its own process group (so a terminal's Ctrl-C reaches the
 * launcher alone, which then stops the children in order), its output kept in a log file and a short tail for
 * error messages, stopped by SIGTERM to the whole group with SIGKILL after a deadline.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, type WriteStream } from 'node:fs';

export interface ProcessSpec {
  /** Short name shown in messages: `agent us`, `redis eu node 2`. */
  readonly name: string;
  readonly command: string;
  readonly args: readonly string[];
  readonly env: NodeJS.ProcessEnv;
  readonly cwd: string;
  /** Every line the process writes goes here. */
  readonly logFile: string;
  /** Called with each complete output line (to echo some of them). */
  readonly onLine?: (line: string) => void;
}

export interface ExitStatus {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

const TAIL_LINES = 30;

export class ManagedProcess {
  readonly name: string;
  readonly logFile: string;
  readonly #child: ChildProcess;
  readonly #log: WriteStream;
  readonly #tail: string[] = [];
  readonly exited: Promise<ExitStatus>;
  #status: ExitStatus | undefined;
  #partial = '';
  #stopping = false;

  constructor(spec: ProcessSpec) {
    this.name = spec.name;
    this.logFile = spec.logFile;
    this.#log = createWriteStream(spec.logFile, { flags: 'a' });
    this.#child = spawn(spec.command, [...spec.args], {
      cwd: spec.cwd,
      env: spec.env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const onData = (data: Buffer) => {
      this.#log.write(data);
      const text = this.#partial + data.toString('utf8');
      const lines = text.split('\n');
      this.#partial = lines.pop() ?? '';
      for (const line of lines) this.#line(line, spec.onLine);
    };
    this.#child.stdout?.on('data', onData);
    this.#child.stderr?.on('data', onData);
    this.exited = new Promise<ExitStatus>((resolve) => {
      this.#child.once('error', (error) => {
        this.#line(`${spec.command}: ${error.message}`, spec.onLine);
        this.#status ??= { code: 127, signal: null };
        this.#log.end();
        resolve(this.#status);
      });
      this.#child.once('close', (code, signal) => {
        if (this.#partial.length > 0) this.#line(this.#partial, spec.onLine);
        this.#status ??= { code, signal };
        this.#log.end();
        resolve(this.#status);
      });
    });
  }

  /** Process id of the group leader; undefined when the command could not be started at all. */
  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** Whether the process has exited. */
  get done(): boolean {
    return this.#status !== undefined;
  }

  /** Whether `stop()` or `kill()` was asked for: an exit after that is expected. */
  get stopping(): boolean {
    return this.#stopping;
  }

  /** The last lines of output, for error messages. */
  tail(): string {
    return this.#tail.join('\n');
  }

  /** SIGTERM to the group; SIGKILL to the group if it has not exited after `timeoutMs`. */
  async stop(timeoutMs: number): Promise<ExitStatus> {
    this.#stopping = true;
    if (this.#status !== undefined) return this.#status;
    this.#signal('SIGTERM');
    const timer = setTimeout(() => this.#signal('SIGKILL'), timeoutMs);
    const status = await this.exited;
    clearTimeout(timer);
    // The leader is gone; anything it left in its group goes too.
    this.#signal('SIGKILL');
    return status;
  }

  /** SIGKILL to the group at once. */
  kill(): void {
    this.#stopping = true;
    this.#signal('SIGKILL');
  }

  #signal(signal: NodeJS.Signals): void {
    const pid = this.#child.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, signal);
    } catch {
      // ESRCH: the group is already empty.
    }
  }

  #line(line: string, onLine: ((line: string) => void) | undefined): void {
    this.#tail.push(line);
    if (this.#tail.length > TAIL_LINES) this.#tail.shift();
    onLine?.(line);
  }
}
