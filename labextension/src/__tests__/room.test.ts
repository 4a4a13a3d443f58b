import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  gpuRoom,
  hostRoom,
  roomKernelLines,
  roomSegments,
  roomText
} from '../room';
import type { IRoomPlace } from '../types';

const GiB = 1024 ** 3;

/** An H200 with two kernels: one idle for 15 min, one running a cell. */
const GPU0: IRoomPlace = {
  where: 'GPU 0',
  index: 0,
  uuid: 'GPU-1234',
  name: 'NVIDIA H200',
  total: 141 * GiB,
  used: 61 * GiB,
  free: 80 * GiB,
  held_by_kernels: 61 * GiB,
  idle: 40 * GiB,
  kernels: [
    { kernel_id: 'k-old', bytes: 40 * GiB, idle_s: 900, kept: null },
    { kernel_id: 'k-busy', bytes: 21 * GiB, idle_s: 2, kept: 'running a cell' }
  ]
};

const HOST: IRoomPlace = {
  where: 'host memory',
  total: 3 * GiB,
  used: 2 * GiB,
  free: 1 * GiB,
  held_by_kernels: 1.5 * GiB,
  idle: 0,
  kernels: [
    {
      kernel_id: 'k-new',
      bytes: 1.5 * GiB,
      idle_s: 30,
      kept: 'used in the last 300 s'
    }
  ]
};

describe('roomText', () => {
  it('says what the kernels hold, what of it is idle and what is free', () => {
    assert.equal(
      roomText(GPU0),
      '61 GiB of 141 GiB held by kernels, 40 GiB idle (could be made room of), 80 GiB free'
    );
  });
  it('names what other processes use on a GPU', () => {
    assert.equal(
      roomText({ ...GPU0, used: 75 * GiB, free: 66 * GiB }),
      '61 GiB of 141 GiB held by kernels, 40 GiB idle (could be made room of), 14 GiB in other use, 66 GiB free'
    );
  });
  it('under the host budget, names what is set aside for kernels coming in, and says when none is idle', () => {
    assert.equal(
      roomText(HOST),
      '1.5 GiB of 3.0 GiB held by kernels, none idle, 512 MiB set aside for kernels coming in, 1.0 GiB free'
    );
  });
  it('says plainly when no kernel holds any, and never shows a negative free', () => {
    assert.equal(
      roomText({
        ...HOST,
        used: 0,
        held_by_kernels: 0,
        free: 3 * GiB,
        kernels: []
      }),
      'None of 3.0 GiB held by kernels, 3.0 GiB free'
    );
    assert.match(roomText({ ...HOST, free: -GiB }), /, 0 B free$/);
  });
});

describe('roomSegments', () => {
  it('splits the bar into idle, kept, other use and free, in percent', () => {
    const bar = roomSegments({ ...GPU0, used: 75 * GiB, free: 66 * GiB });
    assert.deepEqual(
      bar.map(s => s.part),
      ['idle', 'kept', 'other', 'free']
    );
    assert.deepEqual(
      bar.map(s => Math.round(s.percent)),
      [28, 15, 10, 47]
    );
  });
  it('never passes 100 %, even over the budget', () => {
    const bar = roomSegments({ ...HOST, used: 4 * GiB, free: -GiB });
    const sum = bar.reduce((n, s) => n + s.percent, 0);
    assert.ok(sum <= 100 && sum > 99.9, String(sum));
    assert.equal(bar[3].percent, 0);
  });
});

describe('roomKernelLines', () => {
  it('says for each kernel whether it could be suspended to make room, or why not', () => {
    assert.deepEqual(
      roomKernelLines(GPU0, id => `${id}.ipynb`),
      [
        'k-old.ipynb: 40 GiB, unused for 15 min, could be suspended to make room',
        'k-busy.ipynb: 21 GiB, kept: running a cell'
      ]
    );
  });
});

describe('finding a place', () => {
  it('finds a GPU by its UUID and the host budget as the place without a GPU index', () => {
    assert.equal(gpuRoom([GPU0, HOST], 'GPU-1234'), GPU0);
    assert.equal(gpuRoom([HOST], 'GPU-1234'), undefined);
    assert.equal(hostRoom([GPU0, HOST]), HOST);
    assert.equal(hostRoom([GPU0]), undefined);
  });
});
