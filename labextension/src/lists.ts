/**
 * What the side panel shows besides kernel states: the checkpoints, the
 * trash, the GPUs, what each GPU (and the host memory budget) holds, and the
 * doctor's report. No event carries them: they are fetched while the panel
 * shows them and after the operations that change them.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { GpucrClient } from './api';
import { timeValue } from './format';
import type {
  ICheckpoint,
  IDoctorReport,
  IGpu,
  IRoomPlace,
  ITrashItem
} from './types';

export class ServerLists {
  constructor(private readonly _client: GpucrClient) {}

  /** Emitted when a list or the doctor's report changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Checkpoints, newest first. */
  get checkpoints(): ReadonlyArray<ICheckpoint> {
    return this._checkpoints;
  }

  /** Checkpoints of kernels shut down or restarted, newest first. */
  get trash(): ReadonlyArray<ITrashItem> {
    return this._trash;
  }

  get gpus(): ReadonlyArray<IGpu> {
    return this._gpus;
  }

  /** What each GPU (and the host memory budget) holds: `GET /api/gpucr/room`. */
  get room(): ReadonlyArray<IRoomPlace> {
    return this._room;
  }

  get doctor(): IDoctorReport | null {
    return this._doctor;
  }

  /** What the last refresh could not fetch, if anything. */
  get errors(): ReadonlyArray<string> {
    return this._errors;
  }

  /** Whether the lists were fetched at least once. */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Fetch checkpoints, trash, GPUs and what they hold now. */
  async refresh(): Promise<void> {
    const [checkpoints, gpus, trash, room] = await Promise.allSettled([
      this._client.listCheckpoints(),
      this._client.listGpus(),
      this._client.listTrash(),
      this._client.room()
    ]);
    const errors: string[] = [];
    const take = <T>(
      answer: PromiseSettledResult<T[]>,
      keep: (items: T[]) => void
    ) => {
      if (answer.status === 'fulfilled' && Array.isArray(answer.value)) {
        keep(answer.value);
      } else if (answer.status === 'rejected') {
        errors.push(String((answer.reason as Error).message));
      }
    };
    take(checkpoints, items => {
      this._checkpoints = [...items].sort(
        (a, b) => timeValue(b.created) - timeValue(a.created)
      );
    });
    take(trash, items => {
      this._trash = [...items].sort(
        (a, b) => timeValue(b.trashed_at) - timeValue(a.trashed_at)
      );
    });
    take(gpus, items => {
      this._gpus = items;
    });
    take(room, items => {
      this._room = items;
    });
    this._errors = errors;
    this._loaded = true;
    this._changed.emit();
  }

  /** Fetch the doctor report (what works on the server machine). */
  async refreshDoctor(): Promise<IDoctorReport> {
    let report: IDoctorReport;
    try {
      report = await this._client.doctor();
    } catch (error) {
      report = {
        ok: false,
        checks: [
          {
            name: 'gpucr API',
            ok: false,
            detail: (error as Error).message,
            fix: 'Check that the jupyter_gpucr server extension is enabled: jupyter server extension list'
          }
        ]
      };
    }
    this._doctor = report;
    this._changed.emit();
    return report;
  }

  /** A checkpoint was deleted: off the list before the next refresh. */
  dropCheckpoint(checkpointId: string): void {
    this._checkpoints = this._checkpoints.filter(c => c.id !== checkpointId);
    this._changed.emit();
  }

  /** A trash item was deleted: off the list before the next refresh. */
  dropTrash(trashId: string): void {
    this._trash = this._trash.filter(t => t.id !== trashId);
    this._changed.emit();
  }

  dispose(): void {
    Signal.clearData(this);
  }

  private _checkpoints: ICheckpoint[] = [];
  private _trash: ITrashItem[] = [];
  private _gpus: IGpu[] = [];
  private _room: IRoomPlace[] = [];
  private _doctor: IDoctorReport | null = null;
  private _errors: string[] = [];
  private _loaded = false;
  private readonly _changed = new Signal<this, void>(this);
}
