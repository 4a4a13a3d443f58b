/**
 * "Save Point, then Run" (savethenruncommand.ts), its pure parts: the name
 * the save point gets from its cell, why the command cannot be used on a
 * cell now, and the order of its steps (the cell runs only once the save
 * point exists).
 */
import type { IKernelState } from './types';

/**
 * How much of the cell's first line a name keeps, in characters; the server
 * takes names of up to 200 printable characters.
 */
export const CODE_IN_NAME = 60;

/** What Python's `str.isprintable` refuses (control, format, separators), in runs. */
const NOT_PRINTABLE = /[\p{C}\p{Z}]+/gu;

/**
 * The save point's name: `before cell 3: model = train(data)`, the cell's
 * position in the notebook (from 1) and its first line of code, shortened to
 * `CODE_IN_NAME` characters (whole characters: never half of a surrogate
 * pair, which the server would refuse).
 */
export function savePointNameForCell(position: number, source: string): string {
  const firstLine =
    source
      .split(/\r\n|\r|\n/)
      .map(line => line.replace(NOT_PRINTABLE, ' ').trim())
      .find(line => line.length > 0) ?? '';
  const chars = Array.from(firstLine);
  const code =
    chars.length > CODE_IN_NAME
      ? chars
          .slice(0, CODE_IN_NAME - 1)
          .join('')
          .trimEnd() + '…'
      : firstLine;
  return code ? `before cell ${position}: ${code}` : `before cell ${position}`;
}

/** What decides whether a cell can be saved before and run. */
export interface ISaveThenRunTarget {
  /** Whether the cell is a code cell. */
  codeCell: boolean;
  /** The notebook's kernel, if it has one. */
  kernelId: string | null;
  /** `false` once the server answered that it has no gpucr API. */
  gpucr: boolean | null;
  /** Whether an operation of this browser on the kernel is under way. */
  busy: boolean;
  /** What the server last said of the kernel; undefined: not known yet. */
  state: IKernelState | undefined;
}

/** How a server's `engine_reason` for a kernel without the whole-process engine begins. */
const ENGINE_UNAVAILABLE = /^whole-process engine unavailable:\s*/i;

/**
 * Why "Save Point, then Run" cannot be used on this cell now (a sentence for
 * the tooltip); null when it can. A kernel whose state is not known yet can:
 * the server decides, and a refusal is said with "Run anyway".
 */
export function saveThenRunUnavailable(t: ISaveThenRunTarget): string | null {
  if (!t.codeCell) {
    return 'Only a code cell runs in the kernel.';
  }
  if (!t.kernelId) {
    return 'The notebook has no kernel.';
  }
  if (t.gpucr === false) {
    return 'This server has no save points (jupyter-gpucr is not enabled).';
  }
  if (t.busy) {
    return 'The kernel is being suspended, restored or saved; try again when it is done.';
  }
  const state = t.state;
  if (!state) {
    return null;
  }
  if (state.state !== 'running' && state.state !== 'suspended') {
    return `The kernel is ${state.state.replace(/-/g, ' ')}; try again when it is running.`;
  }
  if (state.state === 'suspended' && state.engine !== 'criu') {
    return 'The kernel was suspended as saved variables, which have no save points.';
  }
  // A running kernel's engine is the one it was last suspended with, else
  // the one a suspend would use now: only the server's "unavailable" (or no
  // engine at all) says the whole-process engine cannot take this kernel.
  const reason = state.engine_reason ?? '';
  if (
    state.state === 'running' &&
    (!state.engine ||
      (state.engine !== 'criu' && ENGINE_UNAVAILABLE.test(reason)))
  ) {
    const why = reason.replace(ENGINE_UNAVAILABLE, '');
    return (
      'Save points need the whole-process engine, which this kernel cannot use' +
      (why ? `: ${why}.` : '.')
    );
  }
  return null;
}

/** The steps of "Save Point, then Run". */
export interface ISaveThenRunSteps<T> {
  /** Take the save point; rejects when the server could not. */
  save: () => Promise<T>;
  /** Run the cell. */
  run: (saved: T) => Promise<unknown> | void;
  /** Say that the save point could not be taken (the cell did not run). */
  failed: (error: unknown) => void;
}

/**
 * Take the save point, then run the cell: the cell runs only once the save
 * point exists; when it could not be taken, `failed` hears why and the cell
 * does not run. Resolves to whether the cell was run.
 */
export async function saveThenRun<T>(
  steps: ISaveThenRunSteps<T>
): Promise<boolean> {
  let saved: T;
  try {
    saved = await steps.save();
  } catch (error) {
    steps.failed(error);
    return false;
  }
  await steps.run(saved);
  return true;
}
