/**
 * What each GPU (and the host memory budget) holds, in the side panel's
 * words, from `GET /api/gpucr/room`: how much the kernels hold, how much of
 * that idle kernels hold (gpucr suspends those, least recently used first,
 * when another kernel needs the room), and what is free.
 *
 * Pure functions, unit-tested in src/__tests__/room.test.ts.
 */
import { formatBytes, formatDuration } from './format';
import type { IRoomPlace } from './types';

/** A part of a place's bar, in the order the bar shows them. */
export type RoomPart = 'idle' | 'kept' | 'other' | 'free';

export interface IRoomSegment {
  part: RoomPart;
  /** Percent of the place's total memory. */
  percent: number;
}

/** The room report's row for the GPU with this UUID. */
export function gpuRoom(
  room: ReadonlyArray<IRoomPlace>,
  uuid: string
): IRoomPlace | undefined {
  return room.find(p => p.uuid === uuid);
}

/** The room report's row for the host memory budget, when one is set. */
export function hostRoom(
  room: ReadonlyArray<IRoomPlace>
): IRoomPlace | undefined {
  return room.find(p => p.index === undefined);
}

/**
 * One line: `61 GiB of 141 GiB held by kernels, 40 GiB idle (could be made
 * room of), 80 GiB free`; memory used otherwise (other processes on a GPU,
 * kernels being started or restored under the host budget) is named when
 * there is some.
 */
export function roomText(place: IRoomPlace): string {
  const total = formatBytes(place.total);
  const parts = [
    place.held_by_kernels > 0
      ? `${formatBytes(place.held_by_kernels)} of ${total} held by kernels`
      : `none of ${total} held by kernels`
  ];
  if (place.held_by_kernels > 0) {
    parts.push(
      place.idle > 0
        ? `${formatBytes(place.idle)} idle (could be made room of)`
        : 'none idle'
    );
  }
  const other = otherBytes(place);
  if (other > 0) {
    parts.push(
      place.index === undefined
        ? `${formatBytes(other)} set aside for kernels coming in`
        : `${formatBytes(other)} in other use`
    );
  }
  parts.push(`${formatBytes(Math.max(place.free, 0))} free`);
  const text = parts.join(', ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** The bar: idle kernels, kernels kept, other use, free; in percent of the total. */
export function roomSegments(place: IRoomPlace): IRoomSegment[] {
  const total = place.total > 0 ? place.total : 1;
  const bytes: [RoomPart, number][] = [
    ['idle', place.idle],
    ['kept', place.held_by_kernels - place.idle],
    ['other', otherBytes(place)],
    ['free', place.free]
  ];
  let left = 100;
  return bytes.map(([part, n]) => {
    const percent = Math.min(left, Math.max(0, (100 * n) / total));
    left -= percent;
    return { part, percent };
  });
}

/**
 * One line per kernel, least recently used first, for the row's tooltip:
 * `analysis.ipynb: 20 GiB, unused for 15 min, could be suspended to make room`
 * or `train.ipynb: 21 GiB, kept: running a cell`.
 */
export function roomKernelLines(
  place: IRoomPlace,
  nameOf: (kernelId: string) => string
): string[] {
  return place.kernels.map(k => {
    const what = `${nameOf(k.kernel_id)}: ${formatBytes(k.bytes)}`;
    return k.kept
      ? `${what}, kept: ${k.kept}`
      : `${what}, unused for ${formatDuration(k.idle_s)}, could be suspended to make room`;
  });
}

function otherBytes(place: IRoomPlace): number {
  return Math.max(0, place.used - place.held_by_kernels);
}
