import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  basename,
  formatBytes,
  formatClock,
  formatDuration,
  formatProgress,
  formatSeconds,
  formatSince,
  parseTime,
  phaseLabel,
  progressPercent,
  truncate
} from '../format';

describe('formatBytes', () => {
  it('formats small and large sizes with binary units', () => {
    assert.equal(formatBytes(0), '0 B');
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(1023), '1023 B');
    assert.equal(formatBytes(1024), '1.0 KiB');
    assert.equal(formatBytes(1536), '1.5 KiB');
    assert.equal(formatBytes(123456789), '118 MiB');
    assert.equal(formatBytes(6170000000), '5.7 GiB');
    assert.equal(formatBytes(150 * 1024 ** 3), '150 GiB');
    assert.equal(formatBytes(2 * 1024 ** 4), '2.0 TiB');
  });
  it('never shows 1024 of a unit', () => {
    assert.equal(formatBytes(1024 * 1024 - 1), '1.0 MiB');
    assert.equal(formatBytes(1024 ** 3 - 10), '1.0 GiB');
  });
  it('says ? for unknown values', () => {
    assert.equal(formatBytes(null), '?');
    assert.equal(formatBytes(undefined), '?');
    assert.equal(formatBytes(-1), '?');
    assert.equal(formatBytes(NaN), '?');
    assert.equal(formatBytes(Infinity), '?');
  });
});

describe('formatDuration', () => {
  it('uses the two largest units', () => {
    assert.equal(formatDuration(0), '0 s');
    assert.equal(formatDuration(45.7), '45 s');
    assert.equal(formatDuration(60), '1 min');
    assert.equal(formatDuration(200), '3 min 20 s');
    assert.equal(formatDuration(15 * 60 + 5), '15 min');
    assert.equal(formatDuration(3600), '1 h');
    assert.equal(formatDuration(2 * 3600 + 5 * 60), '2 h 5 min');
    assert.equal(formatDuration(3 * 86400 + 4 * 3600 + 59), '3 d 4 h');
    assert.equal(formatDuration(2 * 86400), '2 d');
  });
  it('says ? for invalid durations', () => {
    assert.equal(formatDuration(-5), '?');
    assert.equal(formatDuration(NaN), '?');
  });
});

describe('formatSince', () => {
  const now = new Date('2026-11-30T18:10:00Z');
  it('is relative to now', () => {
    assert.equal(formatSince('2026-11-30T18:09:55Z', now), 'just now');
    assert.equal(formatSince('2026-11-30T18:09:01Z', now), 'just now');
    assert.equal(formatSince('2026-11-30T18:05:00Z', now), '5 min ago');
    // To the minute: no seconds that a view refreshed now and then would show stale.
    assert.equal(formatSince('2026-11-30T18:06:40Z', now), '3 min ago');
    assert.equal(formatSince('2026-11-30T16:00:00Z', now), '2 h 10 min ago');
    assert.equal(formatSince('2026-11-27T14:00:00Z', now), '3 d 4 h ago');
  });
  it('treats clock skew as just now and unknown as empty', () => {
    assert.equal(formatSince('2026-11-30T18:10:30Z', now), 'just now');
    assert.equal(formatSince(null, now), '');
    assert.equal(formatSince('not a date', now), '');
  });
  it('parses epoch seconds, milliseconds and numeric strings', () => {
    const t = Date.parse('2026-11-30T18:00:00Z');
    assert.equal(parseTime(t / 1000)?.getTime(), t);
    assert.equal(parseTime(t)?.getTime(), t);
    assert.equal(parseTime(String(t / 1000))?.getTime(), t);
    assert.equal(parseTime(0), null);
    assert.equal(formatSince(t / 1000 - 300, new Date(t)), '5 min ago');
  });
  it('formats operation durations', () => {
    assert.equal(formatSeconds(0.84), '0.8 s');
    assert.equal(formatSeconds(2.345), '2.3 s');
    assert.equal(formatSeconds(45), '45 s');
    assert.equal(formatSeconds(200), '3 min 20 s');
    assert.equal(formatSeconds(undefined), '');
  });
  it('parses ISO times', () => {
    assert.equal(
      parseTime('2026-11-30T18:00:00Z')?.toISOString(),
      '2026-11-30T18:00:00.000Z'
    );
    assert.equal(parseTime(''), null);
  });
});

describe('progress', () => {
  it('computes a bounded percentage', () => {
    assert.equal(
      progressPercent({
        phase: 'dumping',
        bytes_done: 1000,
        bytes_total: 5000
      }),
      20
    );
    assert.equal(
      progressPercent({
        phase: 'dumping',
        bytes_done: 9000,
        bytes_total: 5000
      }),
      100
    );
    assert.equal(
      progressPercent({ phase: 'dumping', bytes_done: 5, bytes_total: 0 }),
      null
    );
    assert.equal(
      progressPercent({ phase: 'dumping', bytes_done: 5, bytes_total: null }),
      null
    );
    assert.equal(progressPercent(null), null);
  });
  it('labels phases', () => {
    assert.equal(phaseLabel('gpu-checkpoint'), 'saving GPU memory');
    assert.equal(phaseLabel('dumping'), 'writing image');
    assert.equal(phaseLabel('some-new-phase'), 'some new phase');
    assert.equal(phaseLabel(null), '');
  });
  it('formats progress text', () => {
    // A suspend's total is an estimate: not shown as a size.
    assert.equal(
      formatProgress({
        phase: 'dumping',
        bytes_done: 1024 ** 3,
        bytes_total: 4 * 1024 ** 3
      }),
      'writing image 1.0 GiB (25%)'
    );
    assert.equal(
      formatProgress({ phase: 'dumping', bytes_done: 2048, bytes_total: null }),
      'writing image 2.0 KiB'
    );
    assert.equal(
      formatProgress({
        phase: 'verifying',
        bytes_done: 4 * 1024 ** 3,
        bytes_total: 4 * 1024 ** 3
      }),
      'verifying'
    );
    // A restore reads an image of known size.
    assert.equal(
      formatProgress({
        phase: 'restoring',
        bytes_done: 1024 ** 3,
        bytes_total: 4 * 1024 ** 3
      }),
      'reading image 1.0 GiB / 4.0 GiB (25%)'
    );
    // No GPU step for a kernel without GPU memory.
    const gpuStep = { phase: 'gpu-checkpoint', bytes_done: 0, bytes_total: 5 };
    assert.equal(formatProgress(gpuStep, 'cpu'), 'preparing');
    assert.equal(formatProgress(gpuStep, 'gpu'), 'saving GPU memory');
    assert.equal(
      formatProgress({
        phase: 'verifying',
        bytes_done: null,
        bytes_total: null
      }),
      'verifying'
    );
    assert.equal(formatProgress(null), '');
  });
});

describe('text helpers', () => {
  it('truncates with an ellipsis', () => {
    assert.equal(truncate('short', 10), 'short');
    assert.equal(truncate('a long sentence here', 10), 'a long se…');
  });
  it('takes the base name of paths', () => {
    assert.equal(basename('work/a/Untitled.ipynb'), 'Untitled.ipynb');
    assert.equal(basename('Untitled.ipynb'), 'Untitled.ipynb');
    assert.equal(basename('dir/'), 'dir');
    assert.equal(basename(null), '');
  });
});

describe('formatClock', () => {
  it('says the time today and the date another day', () => {
    const now = new Date(2026, 10, 30, 15, 0);
    assert.equal(
      formatClock(new Date(2026, 10, 30, 9, 5).getTime(), now),
      '09:05'
    );
    assert.equal(
      formatClock(new Date(2026, 10, 29, 23, 59).getTime(), now),
      '29 Nov 23:59'
    );
    assert.equal(formatClock(null, now), '');
  });
});
