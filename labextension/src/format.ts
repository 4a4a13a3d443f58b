/**
 * Formatting helpers: bytes, durations, relative times and progress.
 *
 * Pure functions, unit-tested in src/__tests__/format.test.ts.
 */
import type { IProgress, Timestamp } from './types';

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/**
 * Format a byte count with binary units: `0 B`, `512 B`, `1.5 KiB`,
 * `5.7 GiB`, `118 GiB`. One decimal below 10 units, none above.
 * `null`, `undefined`, negative or non-finite values give `?`.
 */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes) || bytes < 0) {
    return '?';
  }
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  if (unit === 0) {
    return `${Math.round(value)} B`;
  }
  // 1023.96 KiB would round to "1024 KiB": move up one unit instead.
  if (Math.round(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  const text = value < 9.95 ? value.toFixed(1) : Math.round(value).toString();
  return `${text} ${UNITS[unit]}`;
}

/**
 * Format a duration in seconds, with the two largest units:
 * `0 s`, `45 s`, `3 min`, `3 min 20 s` (under 10 min), `2 h 5 min`, `3 d 4 h`.
 */
export function formatDuration(seconds: number): string {
  if (!isFinite(seconds) || seconds < 0) {
    return '?';
  }
  const s = Math.floor(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    const rest = s % 60;
    return minutes < 10 && rest ? `${minutes} min ${rest} s` : `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 24) {
    const rest = minutes % 60;
    return rest ? `${hours} h ${rest} min` : `${hours} h`;
  }
  const days = Math.floor(hours / 24);
  const rest = hours % 24;
  return rest ? `${days} d ${rest} h` : `${days} d`;
}

/**
 * Parse a time: an ISO 8601 string, or a number of seconds since the epoch
 * (milliseconds when it is too large to be seconds). `null` for missing or
 * invalid input.
 */
export function parseTime(value: Timestamp | null | undefined): Date | null {
  if (value === null || value === undefined || value === '') {
    return null;
  }
  let date: Date;
  if (typeof value === 'number') {
    if (!isFinite(value) || value <= 0) {
      return null;
    }
    date = new Date(value > 1e11 ? value : value * 1000);
  } else {
    date = /^\d+(\.\d+)?$/.test(value.trim())
      ? new Date(parseFloat(value) * 1000)
      : new Date(value);
  }
  return isNaN(date.getTime()) ? null : date;
}

/** Milliseconds since the epoch of a time, 0 when unknown (for sorting). */
export function timeValue(value: Timestamp | null | undefined): number {
  return parseTime(value)?.getTime() ?? 0;
}

/**
 * How long ago `time` was, relative to `now`, to the minute: `just now`,
 * `5 min ago`, `2 h 5 min ago`, `3 d 4 h ago`; `''` when the time is
 * unknown. Times slightly in the future (clock skew between browser and
 * server) read `just now`. Every view passes the model's clock as `now`
 * (GpucrModel.now), so that they all say the same.
 */
export function formatSince(
  time: Timestamp | null | undefined,
  now: Date = new Date()
): string {
  const date = parseTime(time);
  if (!date) {
    return '';
  }
  const seconds = (now.getTime() - date.getTime()) / 1000;
  if (seconds < 60) {
    return 'just now';
  }
  const minutes = Math.floor(seconds / 60);
  return `${formatDuration(minutes < 60 ? minutes * 60 : seconds)} ago`;
}

/** A local date and time for tooltips and the side panel, `''` if unknown. */
export function formatDate(time: Timestamp | null | undefined): string {
  const date = parseTime(time);
  return date ? date.toLocaleString() : '';
}

/**
 * A time for a sentence: `14:02` today, `30 Nov 14:02` another day (local
 * time); `''` when unknown.
 */
export function formatClock(
  time: Timestamp | null | undefined,
  now: Date = new Date()
): string {
  const date = parseTime(time);
  if (!date) {
    return '';
  }
  const hm = `${String(date.getHours()).padStart(2, '0')}:${String(date.getMinutes()).padStart(2, '0')}`;
  if (date.toDateString() === now.toDateString()) {
    return hm;
  }
  const month = date.toLocaleString('en', { month: 'short' });
  return `${date.getDate()} ${month} ${hm}`;
}

/** Percentage done, 0 to 100, or `null` when the total is unknown. */
export function progressPercent(
  progress: IProgress | null | undefined
): number | null {
  if (!progress || !progress.bytes_total || progress.bytes_total <= 0) {
    return null;
  }
  const done = Math.max(0, progress.bytes_done ?? 0);
  return Math.min(100, Math.floor((100 * done) / progress.bytes_total));
}

const PHASE_LABELS: { [phase: string]: string } = {
  trimming: 'freeing memory',
  'gpu-checkpoint': 'saving GPU memory',
  dumping: 'writing image',
  verifying: 'verifying',
  done: 'done',
  restoring: 'reading image',
  'gpu-restore': 'restoring GPU memory',
  failed: 'failed'
};

/** A human label for a progress phase; unknown phases are shown as sent. */
export function phaseLabel(phase: string | null | undefined): string {
  if (!phase) {
    return '';
  }
  return PHASE_LABELS[phase] ?? phase.replace(/-/g, ' ');
}

/**
 * Progress as text. While a suspend writes its image the total is the
 * server's estimate (the kernel's memory), not the image's final size: the
 * text says what is written and how far along, `writing image 1.2 GiB (24%)`.
 * A restore reads an image of known size: `reading image 1.2 GiB / 5.0 GiB
 * (24%)`. Other phases have no bytes worth showing: `verifying`. A kernel
 * without GPU memory (`kind` not `gpu`) shows no GPU step: `preparing`.
 */
export function formatProgress(
  progress: IProgress | null | undefined,
  kind: string | null | undefined = 'gpu'
): string {
  if (!progress) {
    return '';
  }
  const phase = progress.phase;
  const label =
    kind !== 'gpu' && phase === 'gpu-checkpoint'
      ? 'preparing'
      : kind !== 'gpu' && phase === 'gpu-restore'
        ? 'finishing'
        : phaseLabel(phase);
  const done = progress.bytes_done;
  const total = progress.bytes_total;
  const percent = progressPercent(progress);
  let bytes = '';
  if (typeof done === 'number' && done > 0) {
    if (phase === 'dumping') {
      bytes = formatBytes(done) + (percent !== null ? ` (${percent}%)` : '');
    } else if (phase === 'restoring') {
      bytes =
        percent !== null
          ? `${formatBytes(done)} / ${formatBytes(total)} (${percent}%)`
          : formatBytes(done);
    }
  }
  return [label, bytes].filter(Boolean).join(' ');
}

/** A duration of an operation in seconds: `0.8 s`, `2.3 s`, `45 s`, `3 min 20 s`. */
export function formatSeconds(seconds: number | null | undefined): string {
  if (typeof seconds !== 'number' || !isFinite(seconds) || seconds < 0) {
    return '';
  }
  if (seconds < 10) {
    return `${seconds.toFixed(1)} s`;
  }
  return formatDuration(seconds);
}

/** Shorten `text` to at most `max` characters with an ellipsis. */
export function truncate(text: string, max: number): string {
  if (text.length <= max) {
    return text;
  }
  return text.slice(0, Math.max(0, max - 1)).trimEnd() + '…';
}

/** The last component of a path: `a/b/c.ipynb` -> `c.ipynb`. */
export function basename(path: string | null | undefined): string {
  if (!path) {
    return '';
  }
  const parts = path.split('/').filter(p => p.length > 0);
  return parts.length ? parts[parts.length - 1] : path;
}
