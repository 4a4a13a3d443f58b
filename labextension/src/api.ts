/**
 * The REST client of the gpucr server extension (docs/rest-api.md), and of
 * the one jupyter_server call the extension makes beside JupyterLab's own
 * (a session on a given kernel): one request function and the typed calls on
 * it. Every request of the extension goes through here. No state: the model
 * (model.ts) keeps what the answers say.
 */
import { PathExt, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type {
  ICheckpoint,
  IDoctorReport,
  IGpu,
  IKernelState,
  IRoomPlace,
  ISavePoint,
  ITrashItem,
  SuspendWhen
} from './types';

/** The URL prefix of the REST API, relative to the server's base URL. */
export const API_PREFIX = 'api/gpucr';

/** An error answer of the REST API, with its HTTP status. */
export class GpucrRequestError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly reason: string | null = null,
    readonly body: { [key: string]: unknown } | null = null
  ) {
    super(message);
    this.name = 'GpucrRequestError';
  }

  /** Whether the server refused a suspend because the kernel runs a cell. */
  get isBusy(): boolean {
    return this.status === 409 && this.body?.error === 'KernelBusyError';
  }

  /** Whether a trashed kernel's id is taken by the fresh kernel of a restart. */
  get isReplaced(): boolean {
    return this.status === 409 && this.body?.error === 'KernelReplacedError';
  }
}

/**
 * Call the gpucr REST API.
 *
 * @param endPoint path under `/api/gpucr/`, already URL-encoded
 * @param init request options (method, body)
 * @param settings server connection settings (token, XSRF, base URL)
 * @returns the decoded JSON answer, `undefined` for 204
 * @throws GpucrRequestError with the server's message on an HTTP error
 */
export function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  return requestServer<T>(URLExt.join(API_PREFIX, endPoint), init, settings);
}

/**
 * Call the server at `path` (relative to its base URL, already URL-encoded);
 * answers and errors as `requestAPI`.
 */
async function requestServer<T>(
  path: string,
  init: RequestInit,
  settings: ServerConnection.ISettings
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  if (response.status === 204) {
    return undefined as T;
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (e.g. tornado's HTML 404 page): keep the text.
    }
  }
  if (!response.ok) {
    let message =
      (data && typeof data === 'object' && (data.message || data.reason)) || '';
    if (!message) {
      message =
        response.status === 404 && typeof data === 'string'
          ? 'Not found (is the jupyter_gpucr server extension enabled?)'
          : response.statusText || `HTTP ${response.status}`;
    }
    // jupyter_server writes {"message", "reason"}; gpucr adds "hint" (what to do).
    const hint =
      data && typeof data === 'object'
        ? data.hint || data.reason || null
        : null;
    throw new GpucrRequestError(
      String(message),
      response.status,
      hint ? String(hint) : null,
      data && typeof data === 'object' ? data : null
    );
  }
  return data as T;
}

function id(value: string): string {
  return encodeURIComponent(value);
}

/** Thin typed client of the REST API (docs/rest-api.md). */
export class GpucrClient {
  constructor(
    readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  listKernels(): Promise<IKernelState[]> {
    return requestAPI<IKernelState[]>('kernels', {}, this.serverSettings);
  }

  getKernel(kernelId: string): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}`,
      {},
      this.serverSettings
    );
  }

  suspend(
    kernelId: string,
    options: GpucrClient.ISuspendOptions = {}
  ): Promise<IKernelState> {
    const body: GpucrClient.ISuspendOptions = {};
    if (options.engine) {
      body.engine = options.engine;
    }
    if (options.when) {
      body.when = options.when;
    }
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/suspend`,
      { method: 'POST', body: JSON.stringify(body) },
      this.serverSettings
    );
  }

  /** Cancel a pending suspend (`suspend-pending`). */
  cancelSuspend(kernelId: string): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/suspend`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  resume(kernelId: string, gpu?: string | number): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/resume`,
      {
        method: 'POST',
        body: JSON.stringify(gpu !== undefined ? { gpu: String(gpu) } : {})
      },
      this.serverSettings
    );
  }

  /**
   * The kernel is about to be used (its user types into a cell): a suspended
   * kernel starts restoring in the background; answers at once (202).
   */
  resumeAhead(kernelId: string): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/resume`,
      { method: 'POST', body: JSON.stringify({ wait: false }) },
      this.serverSettings
    );
  }

  listCheckpoints(): Promise<ICheckpoint[]> {
    return requestAPI<ICheckpoint[]>('checkpoints', {}, this.serverSettings);
  }

  deleteCheckpoint(checkpointId: string): Promise<void> {
    return requestAPI<void>(
      `checkpoints/${id(checkpointId)}`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  listTrash(): Promise<ITrashItem[]> {
    return requestAPI<ITrashItem[]>('trash', {}, this.serverSettings);
  }

  /** Put a trashed checkpoint back: its kernel is suspended again. */
  restoreTrash(
    trashId: string,
    options: GpucrClient.IRestoreOptions = {}
  ): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `trash/${id(trashId)}/restore`,
      { method: 'POST', body: JSON.stringify(options) },
      this.serverSettings
    );
  }

  deleteTrash(trashId: string): Promise<void> {
    return requestAPI<void>(
      `trash/${id(trashId)}`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  listGpus(): Promise<IGpu[]> {
    return requestAPI<IGpu[]>('gpus', {}, this.serverSettings);
  }

  /** What each GPU (and the host memory budget) holds, and what idle kernels could make room of. */
  room(): Promise<IRoomPlace[]> {
    return requestAPI<IRoomPlace[]>('room', {}, this.serverSettings);
  }

  doctor(): Promise<IDoctorReport> {
    return requestAPI<IDoctorReport>('doctor', {}, this.serverSettings);
  }

  /** Copy the kernel into `count` new kernels (`POST .../fork`); their ids. */
  async fork(
    kernelId: string,
    options: { count: number; gpu: string }
  ): Promise<string[]> {
    const made = await requestAPI<{ kernels: { id: string }[] }>(
      `kernels/${id(kernelId)}/fork`,
      { method: 'POST', body: JSON.stringify(options) },
      this.serverSettings
    );
    return made.kernels.map(k => k.id);
  }

  /** The kernel's save points, oldest first. */
  listSavePoints(kernelId: string): Promise<ISavePoint[]> {
    return requestAPI<ISavePoint[]>(
      `kernels/${id(kernelId)}/savepoints`,
      {},
      this.serverSettings
    );
  }

  /** Keep the kernel's whole state now; the kernel runs on as it was. */
  takeSavePoint(kernelId: string, name: string | null): Promise<ISavePoint> {
    return requestAPI<ISavePoint>(
      `kernels/${id(kernelId)}/savepoints`,
      { method: 'POST', body: JSON.stringify(name ? { name } : {}) },
      this.serverSettings
    );
  }

  /** Return the kernel to a save point; what it held goes to the trash (its id). */
  goBackToSavePoint(
    kernelId: string,
    savePointId: string
  ): Promise<{ trash_id: string }> {
    return requestAPI<{ trash_id: string }>(
      `kernels/${id(kernelId)}/savepoints/${id(savePointId)}/restore`,
      { method: 'POST', body: '{}' },
      this.serverSettings
    );
  }

  /**
   * A notebook session at `path` on the running kernel `kernelId`
   * (`POST /api/sessions`: JupyterLab's session manager only starts
   * sessions with new kernels).
   */
  async attachSession(path: string, kernelId: string): Promise<void> {
    await requestServer<unknown>(
      'api/sessions',
      {
        method: 'POST',
        body: JSON.stringify({
          path,
          name: PathExt.basename(path),
          type: 'notebook',
          kernel: { id: kernelId }
        })
      },
      this.serverSettings
    );
  }
}

export namespace GpucrClient {
  /** The body of `POST /api/gpucr/kernels/{id}/suspend`. */
  export interface ISuspendOptions {
    engine?: string;
    when?: SuspendWhen;
  }

  /** The body of `POST /api/gpucr/trash/{id}/restore`. */
  export interface IRestoreOptions {
    /** Shut down the kernel that runs under the same id (a restart's fresh one) first. */
    replace?: boolean;
    /**
     * Give the kernel its notebook sessions back (default); false when this
     * client connects the notebook it has open itself.
     */
    sessions?: boolean;
  }
}
