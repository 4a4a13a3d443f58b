/**
 * Which notification speaks for each kernel, so that the bell's list holds
 * at most one per kernel: a new notice replaces the kernel's last one
 * (closed, whatever its kind), instead of piling up beside it. A notice that
 * lasts until the state changes (sticky) is also closed by that change.
 *
 * No widget: unit-tested in src/__tests__/noticebook.test.ts.
 */
export class NoticeBook {
  /**
   * Notice `id` now speaks for `kernelId`; returns the id of the one it
   * replaces, to close, if any.
   */
  put(kernelId: string, id: string, sticky: boolean): string | undefined {
    const last = this.take(kernelId);
    this._notices.set(kernelId, { id, sticky });
    return last;
  }

  /** Forget the kernel's notice; returns its id, to close, if any. */
  take(kernelId: string): string | undefined {
    const last = this._notices.get(kernelId);
    this._notices.delete(kernelId);
    return last?.id;
  }

  /** Forget the kernel's notice if it is sticky; returns its id, to close. */
  takeSticky(kernelId: string): string | undefined {
    return this._notices.get(kernelId)?.sticky
      ? this.take(kernelId)
      : undefined;
  }

  private _notices = new Map<string, { id: string; sticky: boolean }>();
}
