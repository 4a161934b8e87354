/**
 * What a stack launcher (scripts/stack.ts) leaves behind, read from its state file: the ports it holds and the
 * processes it started. Tests check both are gone after it stops.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import type { StackState } from '../../scripts/stack/launcher.js';
import { isPortFree } from '../../scripts/stack/ports.js';
import { STACK_ID_VAR } from '../../scripts/stack/services.js';

/**
 * Every port of the stack: coordinator, NATS, agents, each Redis (a cluster's nodes and their bus ports, a
 * Sentinel region's nodes and sentinels).
 */
export function portsOf(state: StackState): number[] {
  const port = (url: string) => Number(new URL(url.replace(/^cluster /, 'redis://').split(',')[0]!).port);
  const out = [port(state.coordinator), port(state.nats), ...Object.values(state.agents).map(port)];
  for (const target of Object.values(state.redis)) {
    if (target.startsWith('cluster ')) {
      for (const node of target.slice('cluster '.length).split(',')) {
        const p = Number(node.split(':')[1]);
        out.push(p, p + 10_000);
      }
    } else if (target.startsWith('sentinel ')) {
      // `sentinel <master name> <sentinels>`: each sentinel sits beside its Redis node, 10000 above it.
      for (const sentinel of target.split(' ')[2]!.split(',')) {
        const p = Number(sentinel.split(':')[1]);
        out.push(p, p - 10_000);
      }
    } else out.push(port(target));
  }
  return out;
}

/**
 * Processes whose environment carries the stack's id (the coordinator, the agents, nats-server; Redis rewrites
 * its environment for its title, so it is found by pid and port instead).
 */
export function carryingId(stackId: string): string[] {
  const found: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const environ = readFileSync(`/proc/${entry}/environ`, 'latin1');
      if (environ.split('\0').includes(`${STACK_ID_VAR}=${stackId}`))
        found.push(`pid ${entry} (by its environment)`);
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found;
}

/** Processes of the stack still running: by its id, by the pids the launcher listed, and (`launcher`) itself. */
export function leftovers(state: StackState, options: { launcher?: boolean } = {}): string[] {
  const found = carryingId(state.stackId);
  const listed =
    options.launcher === true ? [...state.processes, { name: 'launcher', pid: state.pid }] : state.processes;
  for (const p of listed) {
    if (p.pid === undefined) continue;
    try {
      process.kill(p.pid, 0);
      found.push(`${p.name} pid ${p.pid}`);
    } catch {
      // ESRCH: gone
    }
  }
  return found;
}

/** Seconds since boot (/proc/uptime): the clock process start times are kept on. */
export function uptimeSeconds(): number {
  return Number(readFileSync('/proc/uptime', 'latin1').split(' ')[0]);
}

/** The process listening on 127.0.0.1:`port`: `none` when no socket listens there, its pid when `ss` names it. */
function listenerOf(port: number): { pid: number | undefined } | 'none' {
  try {
    const line = execFileSync('ss', ['-ltnpH', `sport = :${port}`], { encoding: 'latin1' });
    if (line.trim() === '') return 'none';
    const pid = /pid=(\d+)/.exec(line)?.[1];
    return { pid: pid === undefined ? undefined : Number(pid) };
  } catch {
    return { pid: undefined };
  }
}

/** Seconds since boot at which process `pid` started (field 22 of /proc/PID/stat, 100 ticks a second). */
function startedAt(pid: number): number | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]!.split(' ');
    return Number(fields[19]) / 100;
  } catch {
    return undefined;
  }
}

/** Whether `pid` is one of a stack's: it carries the stack id in its environment, or runs in its data directory. */
function ownedBy(pid: number, owner: { stackId: string; dataDir: string }): boolean {
  try {
    const environ = readFileSync(`/proc/${pid}/environ`, 'latin1');
    if (environ.split('\0').includes(`${STACK_ID_VAR}=${owner.stackId}`)) return true;
    // Redis rewrites its environment for its title: it is known by its working directory, the stack's.
    return readlinkSync(`/proc/${pid}/cwd`).startsWith(owner.dataDir);
  } catch {
    return true;
  }
}

/**
 * The ports of `ports` that a process still listens on. A port only bound by a connection (a local port the
 * kernel gave an outgoing socket) is not counted. On a machine running tests in parallel another test may take a
 * port the stack has freed, or one it had not yet bound: with `startedBefore` (seconds since boot, taken before
 * the stack was told to stop) a listener that started after that instant is not counted, and with `owner` one
 * that is not the stack's (neither its id in the environment nor its data directory as working directory). A
 * listener that cannot be identified is counted.
 */
export async function takenOf(
  ports: readonly number[],
  startedBefore?: number,
  owner?: { stackId: string; dataDir: string },
): Promise<number[]> {
  const free = await Promise.all(ports.map((p) => isPortFree('127.0.0.1', p)));
  return ports.filter((p, i) => {
    if (free[i]) return false;
    const listener = listenerOf(p);
    if (listener === 'none') return false;
    if (listener.pid === undefined) return true;
    if (startedBefore !== undefined && (startedAt(listener.pid) ?? 0) > startedBefore) return false;
    return owner === undefined || ownedBy(listener.pid, owner);
  });
}
