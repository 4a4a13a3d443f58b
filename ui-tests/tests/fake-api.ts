/**
 * A fake of the gpucr REST API, answered inside the browser with
 * `page.route`: it lets the UI be tested (and screenshot) in states this
 * machine cannot reach by itself — a kernel on an H200, a suspend in
 * progress, a failed suspend — with or without the server extension.
 */
import type { Page, Route } from '@playwright/test';

export const GPU = {
  index: 0,
  uuid: 'GPU-5d9c1e6a-1b2c-4d5e-8f90-123456789abc',
  name: 'NVIDIA H200',
  memory_total: 150754820096,
  memory_used: 6170000000,
  memory_free: 144584820096,
  kernels: [] as string[]
};

export type FakeState = 'running' | 'suspending' | 'suspended' | 'restoring';

export class FakeGpucr {
  state: FakeState = 'running';
  error: string | null = null;
  suspendError: { status: number; message: string; hint?: string } | null =
    null;
  hint: string | null = null;
  /** How long POST suspend/resume take, in ms. */
  opDelay = 2500;
  checkpoints: any[] = [];
  requests: string[] = [];
  private _started = 0;

  constructor(
    readonly kernelId: string,
    readonly notebookPath: string
  ) {
    GPU.kernels = [kernelId];
    GPU.memory_used = 6170000000;
    GPU.memory_free = GPU.memory_total - GPU.memory_used;
  }

  kernelState(): any {
    const size = 5.2 * 1024 ** 3;
    const elapsed = Date.now() - this._started;
    const checkpoint = this.checkpoints[0]
      ? {
          id: this.checkpoints[0].id,
          size: this.checkpoints[0].size,
          created: this.checkpoints[0].created,
          engine: 'criu',
          gpu_model: 'NVIDIA H200'
        }
      : null;
    return {
      kernel_id: this.kernelId,
      state: this.state,
      engine: this.state === 'running' ? null : 'criu',
      checkpoint: this.state === 'running' ? null : checkpoint,
      gpu:
        this.state === 'running' || this.state === 'suspending'
          ? {
              index: 0,
              uuid: GPU.uuid,
              name: GPU.name,
              memory_used: GPU.memory_used
            }
          : null,
      progress:
        this.state === 'suspending'
          ? {
              phase: 'dumping',
              bytes_done: Math.min(
                size,
                Math.floor((size * elapsed) / this.opDelay)
              ),
              bytes_total: size
            }
          : this.state === 'restoring'
            ? { phase: 'restoring', bytes_done: 0, bytes_total: size }
            : null,
      suspended_at:
        this.state === 'suspended' ? this.checkpoints[0]?.created : null,
      error: this.error,
      hint: this.hint
    };
  }

  async install(page: Page): Promise<void> {
    await page.route(/\/api\/gpucr\//, route => this._handle(route));
  }

  private async _handle(route: Route): Promise<void> {
    const request = route.request();
    const url = new URL(request.url());
    const path = url.pathname.replace(/^.*\/api\/gpucr\//, '');
    const method = request.method();
    this.requests.push(`${method} ${path}`);
    const json = (body: any, status = 200) =>
      route.fulfill({
        status,
        contentType: 'application/json',
        body: JSON.stringify(body)
      });

    if (method === 'GET' && path === 'kernels') {
      return json([this.kernelState()]);
    }
    if (method === 'GET' && path === `kernels/${this.kernelId}`) {
      return json(this.kernelState());
    }
    if (method === 'GET' && path.startsWith('kernels/')) {
      return json({ message: 'Unknown kernel' }, 404);
    }
    if (method === 'POST' && path === `kernels/${this.kernelId}/suspend`) {
      this.state = 'suspending';
      this.error = null;
      this.hint = null;
      this._started = Date.now();
      await new Promise(r => setTimeout(r, this.opDelay));
      if (this.suspendError) {
        this.state = 'running';
        this.error = this.suspendError.message;
        this.hint = this.suspendError.hint ?? null;
        return json(
          {
            error: 'CRIUError',
            message: this.suspendError.message,
            hint: this.suspendError.hint ?? ''
          },
          this.suspendError.status
        );
      }
      this.state = 'suspended';
      const created = Date.now() / 1000;
      this.checkpoints.unshift({
        id: `ckpt-${this.checkpoints.length + 1}`,
        name: `kernel-${this.kernelId.slice(0, 8)}`,
        kernel_id: this.kernelId,
        created,
        size: Math.round(5.2 * 1024 ** 3),
        engine: 'criu',
        gpu_model: 'NVIDIA H200',
        reason: 'manual',
        notebook_path: this.notebookPath
      });
      GPU.memory_used = 512 * 1024 ** 2;
      GPU.memory_free = GPU.memory_total - GPU.memory_used;
      return json(this.kernelState());
    }
    if (method === 'POST' && path === `kernels/${this.kernelId}/resume`) {
      this.state = 'restoring';
      this._started = Date.now();
      await new Promise(r => setTimeout(r, this.opDelay));
      this.state = 'running';
      GPU.memory_used = 6170000000;
      GPU.memory_free = GPU.memory_total - GPU.memory_used;
      return json(this.kernelState());
    }
    if (method === 'GET' && path === 'checkpoints') {
      return json(this.checkpoints);
    }
    if (method === 'DELETE' && path.startsWith('checkpoints/')) {
      const id = decodeURIComponent(path.slice('checkpoints/'.length));
      this.checkpoints = this.checkpoints.filter(c => c.id !== id);
      return route.fulfill({ status: 204, body: '' });
    }
    if (method === 'GET' && path === 'gpus') {
      return json([GPU]);
    }
    if (method === 'GET' && path === 'doctor') {
      return json({
        ok: true,
        checks: [
          { name: 'criu', ok: true, detail: 'CRIU 4.2 at /usr/sbin/criu' },
          {
            name: 'cuda-checkpoint',
            ok: true,
            detail: 'driver 580.65, CUDA 13.0'
          },
          { name: 'privileges', ok: true, detail: 'root' }
        ]
      });
    }
    return json({ message: `fake gpucr: no route for ${method} ${path}` }, 404);
  }
}
