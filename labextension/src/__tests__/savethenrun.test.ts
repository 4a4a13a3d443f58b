import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  CODE_IN_NAME,
  ISaveThenRunTarget,
  savePointNameForCell,
  saveThenRun,
  saveThenRunUnavailable
} from '../savethenrun';
import { kernel } from './fixtures';

/** What jupyter_gpucr/server/savepoints.py's _checked_name accepts. */
function serverTakes(name: string): boolean {
  return (
    Array.from(name).length <= 200 &&
    !/[\p{C}\p{Z}]/u.test(name.replace(/ /g, ''))
  );
}

describe('savePointNameForCell', () => {
  it('names the cell by its position and first line of code', () => {
    assert.equal(
      savePointNameForCell(3, 'model = train(data)\nprint(model)'),
      'before cell 3: model = train(data)'
    );
  });

  it('skips blank lines and trims the line', () => {
    assert.equal(
      savePointNameForCell(2, '\n   \n    x = 2  \r\ny = 3'),
      'before cell 2: x = 2'
    );
  });

  it('is the position alone for an empty cell', () => {
    assert.equal(savePointNameForCell(1, '  \n'), 'before cell 1');
  });

  it('shortens a long line with an ellipsis, within the server’s limit', () => {
    const name = savePointNameForCell(12, 'x'.repeat(500));
    assert.equal(name, `before cell 12: ${'x'.repeat(CODE_IN_NAME - 1)}…`);
    assert.ok(serverTakes(name));
  });

  it('never cuts a character in half (emoji are two UTF-16 units)', () => {
    const name = savePointNameForCell(1, '😀'.repeat(100));
    assert.equal(name, `before cell 1: ${'😀'.repeat(CODE_IN_NAME - 1)}…`);
    assert.ok(serverTakes(name)); // no lone surrogate (\p{Cs})
  });

  it('replaces what the server would refuse as unprintable', () => {
    const name = savePointNameForCell(4, 'a\tb\u200bc\u2028d\u00a0e');
    assert.equal(name, 'before cell 4: a b c d e');
    assert.ok(serverTakes(name));
  });
});

describe('saveThenRunUnavailable', () => {
  const ready: ISaveThenRunTarget = {
    codeCell: true,
    kernelId: 'k1',
    gpucr: true,
    busy: false,
    state: kernel({ engine: 'criu' })
  };

  it('is available for a running kernel the whole-process engine can take', () => {
    assert.equal(saveThenRunUnavailable(ready), null);
  });

  it('is available for a suspended kernel saved as a whole process', () => {
    assert.equal(
      saveThenRunUnavailable({
        ...ready,
        state: kernel({ state: 'suspended', engine: 'criu' })
      }),
      null
    );
  });

  it('is available while the kernel’s state is not known yet (the server decides)', () => {
    assert.equal(saveThenRunUnavailable({ ...ready, state: undefined }), null);
  });

  it('says why for a kernel not launched by the gpucr provisioner', () => {
    const why = saveThenRunUnavailable({
      ...ready,
      state: kernel({
        engine: 'snapshot',
        engine_reason:
          'whole-process engine unavailable: the kernel was not launched by the gpucr provisioner (c.GPUCR.checkpointable_kernels)'
      })
    });
    assert.equal(
      why,
      'Save points need the whole-process engine, which this kernel cannot use: ' +
        'the kernel was not launched by the gpucr provisioner (c.GPUCR.checkpointable_kernels).'
    );
  });

  it('leaves a kernel restored from saved variables to the server', () => {
    assert.equal(
      saveThenRunUnavailable({
        ...ready,
        state: kernel({ engine: 'snapshot', engine_reason: 'requested' })
      }),
      null
    );
  });

  it('says why without a kernel, a code cell, gpucr, or while busy', () => {
    assert.match(
      saveThenRunUnavailable({ ...ready, kernelId: null }) ?? '',
      /no kernel/
    );
    assert.match(
      saveThenRunUnavailable({ ...ready, codeCell: false }) ?? '',
      /code cell/
    );
    assert.match(
      saveThenRunUnavailable({ ...ready, gpucr: false }) ?? '',
      /no save points/
    );
    assert.match(
      saveThenRunUnavailable({ ...ready, busy: true }) ?? '',
      /try again/
    );
  });

  it('says why while the kernel is on its way to or from disk', () => {
    assert.equal(
      saveThenRunUnavailable({
        ...ready,
        state: kernel({ state: 'suspend-pending', engine: 'criu' })
      }),
      'The kernel is suspend pending; try again when it is running.'
    );
  });

  it('says why for a kernel suspended as saved variables', () => {
    assert.match(
      saveThenRunUnavailable({
        ...ready,
        state: kernel({ state: 'suspended', engine: 'snapshot' })
      }) ?? '',
      /saved variables/
    );
  });
});

describe('saveThenRun', () => {
  it('runs the cell only once the save point exists', async () => {
    const order: string[] = [];
    let taken: (id: string) => void = () => undefined;
    const done = saveThenRun({
      save: () =>
        new Promise<string>(resolve => {
          taken = id => {
            order.push('saved');
            resolve(id);
          };
        }),
      run: saved => {
        order.push(`run after ${saved}`);
      },
      failed: () => order.push('failed')
    });
    await new Promise(resolve => setTimeout(resolve, 0));
    assert.deepEqual(order, []);
    taken('sp1');
    assert.equal(await done, true);
    assert.deepEqual(order, ['saved', 'run after sp1']);
  });

  it('does not run the cell when the save point failed, and says why', async () => {
    const refusal = new Error('The kernel is running a cell.');
    let ran = false;
    let told: unknown = null;
    const result = await saveThenRun({
      save: () => Promise.reject(refusal),
      run: () => {
        ran = true;
      },
      failed: error => {
        told = error;
      }
    });
    assert.equal(result, false);
    assert.equal(ran, false);
    assert.equal(told, refusal);
  });
});
