"""Every option of the server extension, as traits: ``c.GPUCR.<name>`` in jupyter_server_config.py."""
from __future__ import annotations

import os
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, Union, default, validate
from traitlets.config import Configurable

from ..core.objectstore.sealing import key_file_from_environment, previous_key_files_from_environment
from ..core.sizes import parse_size
from ..core.steps.netlocks import NETWORK_LOCK_HOLD
from ..daemon.protocol import DEFAULT_SOCKET


class GPUCR(Configurable):
    """Suspend Jupyter kernels to disk and restore them on demand."""

    store = Unicode(
        "", config=True,
        help="Where checkpoints go: a directory, or object storage as a URL ('s3://bucket/prefix', 'gs://...', "
        "'file:///shared/dir'; each user's checkpoints under PREFIX/USER, USER being $JUPYTERHUB_USER or the login "
        "name). With a URL a kernel is 'uploading' after its suspend and 'suspended' once all of it is in the store, "
        "and a server on another node with the same store lists it and restores it there. Empty: $GPUCR_STORE, else "
        "~/.local/share/jupyter-gpucr.",
    )
    store_options = Dict(
        config=True,
        help="Options of the object store (fsspec's storage_options: for s3, e.g. {'endpoint_url': ..., 'key': ..., "
        "'secret': ..., 'profile': ...}; for gs, e.g. {'token': '/path/key.json', 'project': ...}). Empty: the standard "
        "AWS_* variables (AWS_ENDPOINT_URL included) and profiles; for gs, Google's application default credentials "
        "(GOOGLE_APPLICATION_CREDENTIALS, the metadata server).",
    )
    encryption_key_file = Unicode(
        help="With object storage: a file holding a 256-bit key (32 raw bytes, 64 hex digits or base64; the user's "
        "own, mode 0600 or 0400) with which every object holding a process (images, process files, offloaded tensors, "
        "the manifest) is encrypted before it leaves the node (AES-256-GCM, chunked, each chunk bound to its object "
        "and place); only the leases and upload records stay plaintext. Every node restoring the checkpoints needs the "
        "same key; the local copies in cache_dir stay plaintext. Make one with "
        "'(umask 077; head -c 32 /dev/urandom > KEYFILE)'. Empty: $GPUCR_ENCRYPTION_KEY_FILE, else no encryption.",
    ).tag(config=True)

    @default("encryption_key_file")
    def _encryption_key_file_default(self) -> str:
        return key_file_from_environment()

    previous_encryption_key_files = List(
        Unicode(),
        help="With object storage, after a key rotation: the files of the keys encryption_key_file held before (each "
        "checked as that file is). New checkpoints are always encrypted with encryption_key_file; a checkpoint "
        "encrypted with one of these keys is listed and restored as before, and its kernel's next suspend encrypts "
        "it with the current key. At start the server logs how many checkpoints in the user's prefix each of these "
        "keys still encrypts: one at 0 can be removed. Empty: $GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES (paths separated "
        "by os.pathsep, ':' on Linux), else none.",
    ).tag(config=True)

    @default("previous_encryption_key_files")
    def _previous_encryption_key_files_default(self) -> list[str]:
        return previous_key_files_from_environment()

    cache_dir = Unicode(
        "", config=True,
        help="With object storage: this node's directory for checkpoints being uploaded or downloaded (the local copy "
        "of each is kept, and restores here without a download). Empty: ~/.local/share/jupyter-gpucr. Keep it at "
        "the same path on every node.",
    )
    engine = Enum(
        ["auto", "criu", "snapshot"], default_value="auto", config=True,
        help="How kernels are suspended: 'criu' (whole process, GPU memory included), 'snapshot' "
        "(the kernel saves its own namespace; no privileges needed) or 'auto' (criu when it can run).",
    )
    gpu_placement = Unicode(
        "auto", config=True,
        help="Where restored kernels go: 'auto' (same GPU model with enough free memory, the "
        "original GPU first), or a GPU index or UUID.",
    )
    suspend_on_cull = Bool(
        True, config=True,
        help="When jupyter_server's culler (MappingKernelManager.cull_idle_timeout) finds an idle "
        "kernel, suspend it to disk instead of shutting it down.",
    )
    idle_timeout = Integer(
        0, config=True,
        help="Suspend kernels idle for this many seconds (0: off). A kernelspec's metadata "
        "'gpucr_idle_timeout' overrides it for that kernel type.",
    )
    idle_check_interval = Integer(30, config=True, help="Seconds between idle checks.")
    suspend_busy = Bool(False, config=True, help="Also suspend idle-timed-out kernels that are busy.")
    suspend_connected = Bool(
        True, config=True,
        help="Also suspend idle kernels that have open connections (a notebook tab left open).",
    )
    keep_last = Integer(
        1, config=True,
        help="Checkpoints kept per kernel (older ones are deleted), on this node and in object storage.")
    max_store_bytes = Integer(
        0, config=True,
        help="Delete the oldest checkpoints past this many bytes (the newest of each kernel is always kept). "
        "0: half of the store's disk, measured at server start. With object storage it bounds this node's cache "
        "(cache_dir); max_bucket_bytes bounds the store.",
    )
    max_bucket_bytes = Integer(
        0, config=True,
        help="With object storage: after each upload, delete the oldest checkpoints of the user's prefix (PREFIX/USER) "
        "while it holds more than this many bytes, counted as the store lists them (encrypted sizes with "
        "encryption_key_file). The newest checkpoint of each kernel (a suspended kernel's only way back) and "
        "checkpoints still uploading are never deleted, so the prefix can stay above the limit (the log says so). "
        "0: no limit; keep_last applies either way, and a kernel shut down takes its objects with it.",
    )
    suspended_hours = Float(
        0.0, config=True,
        help="Hours a kernel may stay suspended. Past it the kernel is shut down: its saved state goes to the "
        "trash (for trash_hours, restorable from there), then is deleted. For kernels nobody comes back to, "
        "such as an agent framework's throwaway kernels. 0: kept until shut down. Kernel Gateway's default: 24.",
    )
    max_save_points = Integer(
        5, min=1, config=True,
        help="Save points kept per kernel (POST /api/gpucr/kernels/ID/savepoints, 'gpucr kernel savepoint'); taking "
        "one more drops the oldest. They count in max_store_bytes like every checkpoint, and not in keep_last.",
    )
    trash_hours = Float(
        24.0, config=True,
        help="Hours a suspended kernel's checkpoint stays in the trash after the kernel was shut down or "
        "restarted, so the user can bring it back (gpucr panel, 'gpucr trash restore').",
    )
    restore_on = List(
        Unicode(),
        default_value=["execute_request", "complete_request", "inspect_request", "is_complete_request", "comm_msg"],
        config=True,
        help="Messages that restore a suspended kernel (comm_msg only for comms open at suspend time: a widget "
        "moved). Everything else clients send on their own (kernel_info, history, comm_info, debug, usage requests, "
        "ipywidgets' requests for the widgets' state when a page loads) is answered from what was saved at suspend "
        "time, without restoring.",
    )
    restore_keepalive_s = Float(
        2.0, min=0.1, config=True,
        help="While a restore runs, every websocket with a request waiting for it gets a websocket ping this often, "
        "until the kernel has its request: clients that give up when nothing comes for a while (ag2's executor "
        "after its 'timeout') keep waiting instead of reporting a timeout for code that then runs. A ping is a "
        "frame of the websocket protocol, not a Jupyter message: clients hear one 'status: busy' per request, as "
        "from a fresh kernel (and the same 'busy' again only every 15 s of a restore, for clients that give each "
        "message a deadline, such as autogen-ext's 60 s). 2 s stays well under the shortest such timeouts agents "
        "use (5 s) on a loaded host.",
    )
    suspend_on_stop = Bool(
        True, config=True,
        help="On server stop (SIGTERM, e.g. JupyterHub culling the server), suspend every kernel "
        "before exiting; they are listed again and restored on the next start with the same store.",
    )
    stop_budget = Float(300.0, config=True, help="Seconds allowed for suspending all kernels on server stop.")
    criu_path = Unicode("", config=True, help="Path of the criu binary (empty: search).")
    lock_timeout_ms = Integer(10_000, config=True, help="How long the CUDA driver may wait for running GPU work to finish before the lock fails.")
    trim_before_suspend = Bool(
        True, config=True,
        help="Ask the kernel (gpucr_hooks) to collect garbage and release cached allocator memory before "
        "suspending, so the image holds live data only.",
    )
    daemon_socket = Unicode(
        DEFAULT_SOCKET, config=True,
        help="Unix socket of the gpucr daemon (gpucr-daemon, root). A server without checkpoint privileges "
        "(a JupyterHub user's) launches kernels and runs CRIU through it when it answers; else only the snapshot "
        "engine is available and kernels are launched the stock way. Empty: never use a daemon.",
    )
    spawner_stop_timeout = Float(
        help="Seconds the spawner (JupyterHub) gives this server to stop before it kills it (SIGKILL); 0: unknown. "
        "JupyterHub does not tell the server, so the admin sets it here or as $GPUCR_SPAWNER_STOP_TIMEOUT "
        "(c.Spawner.environment). The server warns at start when stop_budget does not fit.",
    ).tag(config=True)

    @default("spawner_stop_timeout")
    def _spawner_stop_timeout_default(self) -> float:
        try:
            return float(os.environ.get("GPUCR_SPAWNER_STOP_TIMEOUT", "0"))
        except ValueError:
            return 0.0

    offload_gpu_tensors = Bool(
        True, config=True,
        help="Before a whole-process suspend, have the kernel (gpucr_hooks) write its PyTorch CUDA tensors "
        "into the store through pinned buffers with parallel writers and free them, so the GPU is free sooner "
        "and the driver and CRIU handle only the rest; the server puts them on disk while the driver and CRIU "
        "work (the kernel is ended only once they are) and they are refilled right after the restore. Off for "
        "code that keeps raw device "
        "pointers (CUDA graphs).",
    )
    lazy_restore = Bool(
        True, config=True,
        help="Restore a kernel without GPU state lazily: it runs as soon as CRIU has rebuilt it, CRIU's lazy-pages "
        "daemon serves the pages it touches and copies the rest in behind it (userfaultfd; where the kernel lacks it, "
        "restores are eager). The next suspend waits until all of it is back. Should the daemon fail, the kernel is "
        "stopped (never run on with memory missing) and shown suspended in its intact checkpoint. GPU kernels are "
        "always restored eagerly (the CUDA driver's restore through page faults is 40x slower).",
    )
    network_lock_hold = Float(
        NETWORK_LOCK_HOLD, config=True,
        help="Seconds a suspended kernel keeps CRIU's network lock (an nftables table that drops its TCP peers' "
        "packets instead of answering them with a reset, so a peer retransmits until the restore). Linux allows "
        "1024 such tables per host; the locks of checkpoints older than this are released at the next suspend. "
        "The default is about when Linux stops retransmitting (tcp_retries2).",
    )
    prefetch_on_open = Bool(
        True, config=True,
        help="When a client opens a suspended kernel (its notebook is opened or reconnects), read its checkpoint "
        "into the page cache in the background (idle I/O priority), so that a restore that follows reads memory "
        "rather than disk. Never restores the kernel.",
    )
    warm_start_timeout_s = Float(
        300.0, config=True,
        help="When a client opens a kernel the snapshot engine suspended (its notebook is opened or reconnects), "
        "start its process in the background and have it import the modules its saved variables need, so that a "
        "restore that follows only loads them. Until that restore the kernel stays suspended for every client. The "
        "process is stopped when the kernel was not restored within this many seconds, and when it is shut down or "
        "restarted, when host memory (or room on a GPU it holds a context on) is needed for another kernel, or when "
        "the server stops. Only where the host memory budget has room for the restore. Where PyTorch tensors were "
        "saved on a GPU, the process also creates the CUDA context of the GPU they will be loaded on, if that GPU has "
        "room for one, and holds no other GPU memory. 0: off.",
    )
    checkpointable_kernels = Bool(
        True, config=True,
        help="Launch kernels through the gpucr provisioner (own PID namespace, own log files) so that "
        "CRIU can suspend them (when this server may run CRIU, or the gpucr daemon answers). Off: only the snapshot "
        "engine is available.",
    )
    room_policy = Enum(
        ["lru", "never"], default_value="lru", config=True,
        help="When a kernel must be restored (or started) and no GPU of its model, or not the host memory budget, "
        "has room for it: 'lru' suspends idle kernels there, least recently used first, until it fits, then restores "
        "it (the user sees 'waiting for room on GPU 0: suspending 2 idle kernels'); 'never' refuses with the reason.",
    )
    room_headroom = Union(
        [Float(), Unicode()], default_value="", config=True,
        help="Room kept free ahead ('17GiB'): after each restore or start that made room on a GPU (or under "
        "host_memory_budget), idle kernels there are suspended in the background, least recently used first and "
        "as room_policy and min_resident_s allow, until this much is free again; the next kernel to come back "
        "then waits for its own restore only. The same room is kept on a GPU as kernels grow: after a cell of a "
        "kernel holding memory there, idle kernels there are suspended (reason 'gpu-memory'), never that kernel. "
        "One kernel's declared memory is a good value. Empty or 0: room is made only when a kernel needs it.",
    )
    budget_check_interval = Float(
        2.0, min=0.1, config=True,
        help="Seconds between checks of host_memory_budget while kernels run: kernels grow after they start or "
        "come back (a cell that loads data), and when what they hold passes the budget, idle kernels are suspended, "
        "least recently used first and as room_policy and min_resident_s allow, until it holds again. The budget is "
        "also checked when a cell ends and when memory comes under pressure (the server's memory cgroup, else the "
        "host), between these checks.",
    )
    min_resident_s = Float(
        300.0, config=True,
        help="Seconds a kernel stays safe from being suspended to make room after its last activity (a cell, its "
        "output, any request).",
    )
    evict_others = Bool(
        False, config=True,
        help="Also suspend the kernels of other users (of a server whose kernels run as several users) to make "
        "room; a user's own kernels go first either way.",
    )
    host_memory_budget = Union(
        [Float(), Unicode()], default_value="", config=True,
        help="The most host memory (bytes, '3GiB', or a fraction of RAM such as 0.5) the kernels of this server "
        "may hold at once, counting each kernel's RSS (or its declared kernel_memory, whichever is larger); a "
        "restore or start that would pass it makes room as room_policy says. Empty or 0: no budget.",
    )
    kernel_memory = Union(
        [Float(), Unicode()], default_value="", config=True,
        help="The host memory a kernel is declared to take ('1GiB'; a kernelspec's metadata 'gpucr_memory' "
        "overrides it): a new kernel's start makes this much room under host_memory_budget, and a kernel counts "
        "at least this much against it. Empty: its RSS only.",
    )

    portable_fallback = Bool(
        False, config=True,
        help="A whole-process suspend also has the kernel save its variables (as the snapshot engine does) beside "
        "the image, so that a node whose CPU features, NVIDIA driver or GPU model cannot run the image (or that has "
        "no CRIU) restores the variables instead, the kernel's state saying why and what was lost. Costs a second "
        "copy of the variables at every suspend; meant for object storage, where the next node is the hub's choice.",
    )
    lease_timeout_s = Float(
        120.0, config=True,
        help="With object storage: a node running a kernel renews its lease every quarter of this; a lease not "
        "renewed for this long (its node was lost) is taken over by the next node that restores the kernel, from "
        "its last durable checkpoint. The nodes' clocks must agree to well within it (NTP).",
    )
    shared_paths = List(
        Unicode(), config=True,
        help="With object storage: the folders every node mounts at the same path with the same files (the user's "
        "home on its persistent volume). Files a kernel holds open there must be as it left them on the node that "
        "restores it. Files it holds open in /tmp, /var/tmp, /dev/shm or in a working directory outside these "
        "folders are copied into the checkpoint and put back at their paths on another node. Default: the home "
        "directory.",
    )
    max_scratch_bytes = Union(
        [Float(), Unicode()], default_value="2GiB", config=True,
        help="With object storage: the most bytes of scratch files (see shared_paths) a suspend copies into the "
        "checkpoint; a kernel holding more is not suspended (it runs on, the error names the files).",
    )

    @default("shared_paths")
    def _shared_paths_default(self) -> list[str]:
        return [os.path.expanduser("~")]

    kernel_gpu_memory = Union(
        [Float(), Unicode()], default_value="", config=True,
        help="The GPU memory a new kernel is declared to take ('8GiB'; a kernelspec's metadata 'gpucr_gpu_memory' "
        "overrides it): its start makes that much room, as room_policy says, on the GPU its CUDA programs use by "
        "default (GPU 0, or the first of its CUDA_VISIBLE_DEVICES). Empty: none is made at start.",
    )

    @validate("host_memory_budget", "kernel_memory", "kernel_gpu_memory", "max_scratch_bytes", "room_headroom")
    def _valid_size(self, proposal: Any) -> Any:
        try:
            parse_size(proposal["value"], 1)
        except ValueError as e:
            raise TraitError(f"c.GPUCR.{proposal['trait'].name}: {e}") from None
        return proposal["value"]
