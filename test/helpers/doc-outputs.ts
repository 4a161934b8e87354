/**
 * The outputs the docs show under a command, as comments (`# {"allowed":true,…}`), checked against what the
 * command prints when the docs-examples test runs it. A comment group right under a command is its documented
 * output from its first line that starts with `{` or `[` (lines before it are prose: a status, an ETag); `…`
 * stands for what is left out (fields of an object, elements of an array). A group whose first line starts with
 * `e.g.` is an illustration (an instant, a sequence number, a policy whose lease may not have arrived yet) and is
 * not compared.
 */

/** One documented output: the command's place and the JSON shown, as written. */
export interface DocumentedOutput {
  id: number;
  /** Line of the comment in its file. */
  line: number;
  text: string;
}

export const OUTPUT_BEGIN = 'QP-EXAMPLE-OUTPUT-BEGIN';
export const OUTPUT_END = 'QP-EXAMPLE-OUTPUT-END';

/**
 * `code` (a block starting at `firstLine` of its file) with markers printed around each command whose output is
 * documented, and those outputs, numbered from `firstId`.
 */
export function instrument(
  code: string,
  firstLine: number,
  firstId: number,
): { code: string; outputs: DocumentedOutput[] } {
  const lines = code.split('\n');
  const out: string[] = [];
  const outputs: DocumentedOutput[] = [];
  let commandStart: number | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const isComment = /^\s*#/.test(line);
    if (!isComment && line.trim() !== '' && commandStart === undefined) commandStart = out.length;
    out.push(line);
    if (isComment || line.trim() === '' || line.endsWith('\\')) continue;
    // The command ends here: is a documented output right under it?
    let j = i + 1;
    const group: string[] = [];
    while (j < lines.length && /^#/.test(lines[j]!)) group.push(lines[j++]!.replace(/^#\s?/, ''));
    const start = group.findIndex((g) => /^\s*[[{]/.test(g));
    if (group.length > 0 && !/^\s*e\.g\./.test(group[0]!) && start >= 0) {
      const id = firstId + outputs.length;
      outputs.push({
        id,
        line: firstLine + 1 + i + 1 + start,
        text: group
          .slice(start)
          .map((g) => g.trim())
          .join(''),
      });
      out.splice(commandStart!, 0, `printf '\\n%s\\n' '${OUTPUT_BEGIN} ${id}'`);
      out.push(`printf '\\n%s\\n' '${OUTPUT_END} ${id}'`);
    }
    commandStart = undefined;
  }
  return { code: out.join('\n'), outputs };
}

/** What each marked command printed, by id. */
export function printed(stdout: string): Map<number, string> {
  const found = new Map<number, string>();
  const re = new RegExp(`^${OUTPUT_BEGIN} (\\d+)\\n([\\s\\S]*?)\\n${OUTPUT_END} \\1$`, 'gm');
  for (const m of stdout.matchAll(re)) found.set(Number(m[1]), m[2]!);
  return found;
}

/** The documented JSON with its elisions (`…`) taken out; throws when what is left is not JSON. */
export function parseDocumented(text: string): unknown {
  const json = text
    .replace(/,\s*…/g, '')
    .replace(/…\s*,/g, '')
    .replace(/\[\s*…\s*\]/g, '[]');
  return JSON.parse(json);
}

/**
 * Where `actual` differs from the documented `shown`, or undefined: every field shown is there with the value
 * shown (more fields may be), and the elements of an array shown appear in that order (more may be around them).
 */
export function mismatch(actual: unknown, shown: unknown, path = '$'): string | undefined {
  if (Array.isArray(shown)) {
    if (!Array.isArray(actual)) return `${path}: an array was shown, got ${JSON.stringify(actual)}`;
    let from = 0;
    for (let i = 0; i < shown.length; i++) {
      let k = from;
      while (k < actual.length && mismatch(actual[k], shown[i], `${path}[${k}]`) !== undefined) k++;
      if (k === actual.length) {
        return `${path}: no element from [${from}] on matches ${JSON.stringify(shown[i])} (got ${JSON.stringify(actual)})`;
      }
      from = k + 1;
    }
    return undefined;
  }
  if (shown !== null && typeof shown === 'object') {
    if (actual === null || typeof actual !== 'object' || Array.isArray(actual)) {
      return `${path}: an object was shown, got ${JSON.stringify(actual)}`;
    }
    for (const [key, value] of Object.entries(shown)) {
      if (!(key in actual)) return `${path}.${key}: shown, missing`;
      const inner = mismatch((actual as Record<string, unknown>)[key], value, `${path}.${key}`);
      if (inner !== undefined) return inner;
    }
    return undefined;
  }
  return Object.is(actual, shown)
    ? undefined
    : `${path}: ${JSON.stringify(shown)} shown, ${JSON.stringify(actual)} printed`;
}
