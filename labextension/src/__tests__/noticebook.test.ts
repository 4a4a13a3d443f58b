import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { NoticeBook } from '../noticebook';

describe('NoticeBook: one notice per kernel in the bell', () => {
  it('replaces the kernel’s last notice, whatever its kind', () => {
    const book = new NoticeBook();
    assert.equal(book.put('a', 'n1', false), undefined);
    assert.equal(book.put('b', 'n2', false), undefined, 'another kernel');
    assert.equal(book.put('a', 'n3', true), 'n1');
    assert.equal(book.put('a', 'n4', false), 'n3');
  });

  it('closes on a state change only what is sticky', () => {
    const book = new NoticeBook();
    book.put('a', 'routine', false);
    assert.equal(book.takeSticky('a'), undefined);
    assert.equal(book.put('a', 'failure', true), 'routine');
    assert.equal(book.takeSticky('a'), 'failure');
    assert.equal(book.takeSticky('a'), undefined);
    assert.equal(book.put('a', 'next', false), undefined);
  });
});
