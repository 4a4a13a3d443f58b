"""The core engine end to end with a real CRIU: an agent-like process is started with
``gpucr run``, checkpointed, restored, and must prove its state survived."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.criu.commands import dump_id, network_lock_tables
from jupyter_gpucr.core.errors import BusyError, CheckpointDamagedError, EngineError
from jupyter_gpucr.core.hostmemory import free_page_reporting
from jupyter_gpucr.core.process.procs import tree
from jupyter_gpucr.core.steps import restore as restore_step
from jupyter_gpucr.core.storage.locks import exclusive
from tests.conftest import agent_command, ask, gone, wait_for_line


def gpucr(store: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpucr {args} failed: {proc.stdout}{proc.stderr}")
    return proc


def start_agent(store: Path, name: str, tmp_path: Path, mb: int = 300) -> tuple[dict, Path]:
    env_file = tmp_path / f"{name}.counts"
    os.environ["AGENT_FILE"] = str(env_file)
    gpucr(store, "run", "--name", name, "--", *agent_command("cpu_agent.py", str(mb)))
    hello = wait_for_line(store / "procs" / name / "stdout.log")
    return hello, env_file


def read_counts(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_agent_survives_checkpoint_and_restore(criu_path, store_dir, tmp_path):
    hello, counts = start_agent(store_dir, "agent", tmp_path)
    before = ask(hello["port"])
    assert before["checksum"] == hello["checksum"]
    pid = json.loads(gpucr(store_dir, "--json", "ls").stdout)[0]["pid"]

    out = gpucr(store_dir, "--json", "checkpoint", "agent")
    ckpt = json.loads(out.stdout)
    assert gone(pid)
    assert ckpt["size"] > 300 << 20
    timings = json.loads((store_dir / "checkpoints" / ckpt["id"] / "manifest.json").read_text())["timings"]
    # CRIU's own split of its dump: writing the 300 MB came within collecting them, within the freeze
    assert 0 < timings["criu_memwrite"] <= timings["criu_memdump"] <= timings["criu_frozen"] <= timings["dump"], timings
    counter_at_checkpoint = read_counts(counts)[-1]
    time.sleep(0.5)
    assert read_counts(counts)[-1] == counter_at_checkpoint, "the process kept running after the checkpoint"

    restored = json.loads(gpucr(store_dir, "--json", "restore", "agent").stdout)
    assert restored["state"] == "running" and restored["pid"] != pid
    after = ask(hello["port"])  # the listening socket works again
    assert after["checksum"] == before["checksum"]
    assert after["pid"] == before["pid"], "the process sees the same PID inside its namespace"
    assert after["counter"] >= counter_at_checkpoint
    time.sleep(0.5)
    seen = read_counts(counts)
    assert seen == list(range(1, len(seen) + 1)), "the counter file must continue without gaps or repeats"
    assert seen[-1] > counter_at_checkpoint
    gpucr(store_dir, "rm", "--kill", "agent")


def test_restore_while_original_pid_is_taken(criu_path, store_dir, tmp_path):
    hello, _ = start_agent(store_dir, "pidclash", tmp_path, mb=50)
    cr = Checkpointer(store_dir)
    pid = cr.status("pidclash")["pid"]
    cr.checkpoint("pidclash")
    assert gone(pid)
    squatter = _occupy_pid(pid)
    try:
        assert psutil.pid_exists(pid), "the original PID must be occupied during the restore"
        running = cr.restore("pidclash")
        assert running.pid != pid
        assert ask(hello["port"])["checksum"] == hello["checksum"]
    finally:
        squatter.kill()
        cr.remove("pidclash", kill=True)


def _occupy_pid(pid: int) -> subprocess.Popen:
    """Start a process with exactly ``pid`` (ns_last_pid) unless some zombie already holds it. The
    dumped process's own zombie is usually reaped within milliseconds (CI dry run: it vanished
    between a check and the assertion after it): wait for that first."""
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if psutil.pid_exists(pid):
        return subprocess.Popen(["sleep", "60"])
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "60"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"could not occupy PID {pid}")


@pytest.mark.parametrize("restore_args", [[], ["--eager"]], ids=["lazy", "eager"])
def test_damaged_checkpoint_is_refused_and_kept(criu_path, store_dir, tmp_path, restore_args):
    _hello, counts = start_agent(store_dir, "damaged", tmp_path, mb=20)
    cr = Checkpointer(store_dir, lazy_restore=not restore_args)
    ckpt = cr.checkpoint("damaged")
    pages = max(ckpt.images.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    with open(pages, "r+b") as f:
        f.seek(pages.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    res = gpucr(store_dir, "restore", "damaged", *restore_args, check=False)
    assert res.returncode == 1
    assert "is damaged" in res.stderr and "checksum mismatch" in res.stderr and "kept" in res.stderr
    assert ckpt.path.is_dir() and pages.exists()
    assert cr.status("damaged")["state"] == "checkpointed"
    # CRIU restored it (the flipped byte is data) while the images were hashed: it was never let run
    status_arg = f"--status={store_dir / 'procs' / 'damaged' / '.status'}"
    assert not [p for p in psutil.process_iter(["cmdline"]) if status_arg in (p.info["cmdline"] or [])]
    ticks = counts.read_text()
    time.sleep(1)
    assert counts.read_text() == ticks
    with pytest.raises(CheckpointDamagedError):
        cr.restore("damaged")
    cr.remove("damaged")


@pytest.fixture
def tiny_store(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], check=True)
    yield mnt / "store"
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_dump_that_cannot_complete_leaves_process_running(criu_path, tiny_store, tmp_path):
    hello, counts = start_agent(tiny_store, "big", tmp_path, mb=100)
    pid = Checkpointer(tiny_store).status("big")["pid"]
    # The check before acting refuses at once ...
    res = gpucr(tiny_store, "checkpoint", "big", check=False)
    assert res.returncode == 1 and "Not enough disk" in res.stderr and "left running" in res.stderr
    # ... and without that check, CRIU runs out of space mid-dump and the process is resumed.
    cr = Checkpointer(tiny_store, check_space=False)
    with pytest.raises(EngineError) as err:
        cr.checkpoint("big")
    assert "left running" in str(err.value) and "disk is full" in str(err.value)
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    n = read_counts(counts)[-1]
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    time.sleep(0.3)
    assert read_counts(counts)[-1] > n, "the process must keep running"
    assert not list((tiny_store / "checkpoints").iterdir()), "no partial checkpoint may remain"
    cr.remove("big", kill=True)


def test_work_before_the_dump_runs_frozen_free_and_its_failure_leaves_the_process_running(criu_path, store_dir, tmp_path):
    """``before_dump`` is where the server waits for a kernel to finish writing its offloaded
    GPU tensors: it runs before CRIU freezes the process, and if it fails nothing is dumped."""
    hello, counts = start_agent(store_dir, "late", tmp_path, mb=10)
    cr = Checkpointer(store_dir)
    pid = cr.status("late")["pid"]

    def still_writing() -> None:
        n = read_counts(counts)[-1]
        time.sleep(0.3)
        assert read_counts(counts)[-1] > n, "the process must not be frozen yet"
        raise EngineError("Writing the kernel's GPU tensors failed: OSError: [Errno 28] No space left on device.")

    with pytest.raises(EngineError) as err:
        cr.checkpoint("late", before_dump=still_writing)
    assert "No space left on device" in str(err.value) and "left running" in str(err.value)
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert not list((store_dir / "checkpoints").iterdir()), "no partial checkpoint may remain"

    calls = []
    ckpt = cr.checkpoint("late", before_dump=lambda: calls.append(read_counts(counts)[-1]))
    assert calls and "before_dump" in ckpt.manifest["timings"]
    cr.restore("late")
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    cr.remove("late", kill=True)


def test_restored_process_gets_its_huge_pages_back(criu_path, store_dir, tmp_path):
    """CRIU restores memory in 4 KiB pages; gpucr collapses the dense regions into huge pages
    again, so the process and its next dump are as fast as before."""
    start_agent(store_dir, "thp", tmp_path, mb=300)
    cr = Checkpointer(store_dir)

    def huge_bytes() -> int:
        text = Path(f"/proc/{cr.status('thp')['pid']}/smaps_rollup").read_text()
        return int(text.split("AnonHugePages:")[1].split()[0]) << 10

    try:
        before = huge_bytes()
        if before < 200 << 20:
            pytest.skip(f"this kernel gave the agent's array no transparent huge pages ({before >> 20} MiB)")
        cr.checkpoint("thp")
        cr.restore("thp")
        deadline = time.monotonic() + 30
        while huge_bytes() < 0.9 * before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert huge_bytes() >= 0.9 * before, f"{huge_bytes() >> 20} MiB in huge pages after the restore, {before >> 20} before"
    finally:
        cr.remove("thp", kill=True)


def test_second_operation_on_same_process_is_busy(criu_path, store_dir, tmp_path):
    start_agent(store_dir, "busy", tmp_path, mb=10)
    cr = Checkpointer(store_dir)
    with exclusive(cr.store.proc_dir("busy"), "busy", "checkpoint"):
        res = gpucr(store_dir, "checkpoint", "busy", check=False)
    assert res.returncode == 1 and "is busy: checkpoint (pid" in res.stderr
    with pytest.raises(BusyError):
        with exclusive(cr.store.proc_dir("busy"), "busy", "checkpoint"):
            cr.checkpoint("busy")
    cr.remove("busy", kill=True)


def test_store_is_private_and_retention_applies(criu_path, store_dir, tmp_path):
    hello, _ = start_agent(store_dir, "keep", tmp_path, mb=10)
    cr = Checkpointer(store_dir, keep_last=2)
    ids = [cr.checkpoint("keep", leave_running=True).id for _ in range(3)]
    assert [c.id for c in cr.store.list_checkpoints("keep")] == ids[1:]
    ckpt = cr.store.latest("keep")
    for p in [cr.store.root, *ckpt.path.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), f"{p} has mode {oct(mode)}"
    manifest = ckpt.manifest
    assert manifest["engine"] == "criu" and manifest["criu"]["version"].startswith("4.")
    assert all(len(f["xxh3_128"]) == 32 for f in manifest["files"].values())
    assert ask(hello["port"])["checksum"] == hello["checksum"], "--leave-running keeps the process"
    cr.remove("keep", kill=True)


@pytest.mark.parametrize("bad", ["../etc", "a/b", "..", ".hidden", ""])
def test_bad_names_are_refused(store_dir, bad):
    res = gpucr(store_dir, "restore", bad, check=False)
    assert res.returncode == 1 and "Invalid name" in res.stderr
    assert not (store_dir.parent / "etc").exists()


def test_doctor_reports_criu(criu_path, store_dir):
    rep = json.loads(gpucr(store_dir, "--json", "doctor", check=False).stdout)
    checks = {c["name"]: c for c in rep["checks"]}
    assert checks["criu"]["ok"] and "CRIU 4." in checks["criu"]["detail"]
    assert checks["criu check"]["ok"]
    assert checks["userfaultfd"]["ok"] == Checkpointer(store_dir).criu.lazy_pages_supported
    tracking = checks["dirty-page tracking"]  # a note either way: save points work without it
    assert tracking["ok"] == Checkpointer(store_dir).criu.dirty_tracking and tracking["severity"] in ("ok", "note")
    assert "nvidia driver" in checks
    reporting = bool(free_page_reporting())
    assert ("freed memory" in checks) == reporting, checks.get("freed memory")
    if reporting:
        assert not checks["freed memory"]["ok"] and "free page reporting" in checks["freed memory"]["fix"]


@pytest.mark.parametrize("devices, expected", [
    ({"virtio0": ("0x0002", "0" * 64)}, None),                            # a disk, no balloon
    ({"virtio0": ("0x0002", "1" * 64), "virtio1": ("0x0005", "0110010" + "0" * 57)}, True),
    ({"virtio3": ("0x0005", "0110000" + "0" * 57)}, False),             # a balloon without reporting
])
def test_free_page_reporting_is_read_from_the_balloons_features(tmp_path, devices, expected):
    """Bit 5 of the features a virtio balloon negotiated (VIRTIO_BALLOON_F_REPORTING), as sysfs lists them."""
    for name, (device, features) in devices.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "device").write_text(device + "\n")
        (tmp_path / name / "features").write_text(features + "\n")
    assert free_page_reporting(tmp_path) is expected


def test_missing_criu_is_a_clear_error(store_dir, tmp_path):
    hello, _ = start_agent(store_dir, "nocriu", tmp_path, mb=10)
    res = gpucr(store_dir, "--criu", str(tmp_path / "missing-criu"), "checkpoint", "nocriu", check=False)
    assert res.returncode == 1
    assert f"CRIU is not installed (looked at {tmp_path / 'missing-criu'})" in res.stderr
    assert "gpucr install-criu" in res.stderr and "GPUCR_CRIU" in res.stderr
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    Checkpointer(store_dir).remove("nocriu", kill=True)


def test_criu_is_found_from_a_python_of_another_environment(tmp_path):
    """A server started from another environment that imports this package (PYTHONPATH) finds the
    CRIU bundle of the environment the package is installed in (here: the checkout's .venv), not
    only one beside its own Python."""
    bundle = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "criu"
    if not os.access(bundle, os.X_OK):
        pytest.skip("no CRIU bundle in the checkout's .venv (scripts/setup.sh installs it)")
    other = tmp_path / "other-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    found = subprocess.run([str(other / "bin" / "python"), "-c", "from jupyter_gpucr.core.criu.commands import find_criu; print(find_criu())"],
                           capture_output=True, text=True, check=True, env={
                               "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                               # the package from the checkout, what it imports from this environment
                               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                              *[p for p in sys.path if p.endswith("site-packages")]])})
    assert found.stdout.strip() == str(bundle)


def test_namespace_outlives_its_process_while_criu_works_in_it(criu_path, store_dir):
    """The holder must not tear the namespace down when its process dies while another program
    (CRIU, entered with nsenter) still runs in it: CRIU kills the process it dumped, then finishes."""
    cr = Checkpointer(store_dir)
    running = cr.run("ns", ["sleep", "60"])
    visitor = subprocess.Popen(["nsenter", "-t", str(running.pid), "-p", "-m", "--", "sleep", "1.5"])
    time.sleep(0.3)
    os.kill(running.pid, 9)  # what CRIU does to the dumped tree before it exits
    time.sleep(0.5)
    assert visitor.poll() is None, "the visitor was killed with the namespace"
    assert visitor.wait(timeout=10) == 0
    running.started.popen.wait(timeout=10)  # and then the holder exits


def test_changed_and_deleted_open_files_are_named_with_what_to_do(criu_path, store_dir, tmp_path):
    """CRIU reopens a suspended process's files by path and refuses changed ones tersely; the user
    gets the file, what changed and a command that lets the restore proceed."""
    grown, gone = tmp_path / "notes.txt", tmp_path / "scratch.bin"
    grown.write_text("hello\n")
    script = f"import time; a = open({str(grown)!r}, 'r+'); b = open({str(gone)!r}, 'w')\nwhile True: time.sleep(0.1)"
    cr = Checkpointer(store_dir)
    cr.run("files", [sys.executable, "-c", script])
    time.sleep(1)
    cr.checkpoint("files")
    with open(grown, "a") as f:
        f.write("written while suspended\n")
    gone.unlink()

    res = gpucr(store_dir, "restore", "files", check=False)
    assert res.returncode == 1
    assert f"The file {grown}" in res.stderr and "changed size" in res.stderr and "6 at the checkpoint" in res.stderr
    assert f"'truncate -s 6 {grown}'" in res.stderr and "checkpoint is kept" in res.stderr
    subprocess.run(["truncate", "-s", "6", str(grown)], check=True)

    res = gpucr(store_dir, "restore", "files", check=False)
    assert res.returncode == 1 and f"The file {gone}" in res.stderr and "No such file or directory" in res.stderr
    assert f"'touch {gone}'" in res.stderr
    gone.touch()

    running = cr.restore("files")
    assert psutil.Process(running.pid).status() != psutil.STATUS_ZOMBIE
    cr.remove("files", kill=True)


def _umask(pid: int) -> str:
    return next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Umask:"))


def _same_and_counting(cr: Checkpointer, hello: dict, counts: Path) -> None:
    """The restored agent holds the memory it started with, counts on without a gap, and the page
    daemon left no socket behind."""
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    time.sleep(0.3)
    seen = read_counts(counts)
    assert seen == list(range(1, len(seen) + 1)), "the counter file must continue without gaps or repeats"
    assert not list(cr.store.checkpoints_root.glob("*/lazy-pages.socket")), "the daemon's socket is left behind"


def test_lazily_restored_process_runs_at_once_and_can_be_checkpointed_again_right_away(criu_path, store_dir, tmp_path):
    """A restore hands the process back before its memory is: CRIU's lazy-pages daemon serves what
    it touches and copies the rest behind it. A checkpoint straight after must still hold all of
    it, and restore to the same state."""
    hello, counts = start_agent(store_dir, "lazy", tmp_path, mb=400)
    cr = Checkpointer(store_dir)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd for lazy restores")
    try:
        cr.checkpoint("lazy")
        cr.restore("lazy")
        assert (store_dir / "procs" / "lazy" / ".pages").exists(), "the restore was not lazy"
        ckpt = cr.checkpoint("lazy")  # waits for the pages, whatever point the daemon reached
        assert json.loads((store_dir / "procs" / "lazy" / ".pages").read_text()) == {"pages": "in"}
        assert ckpt.size > 400 << 20
        cr.restore("lazy")
        _same_and_counting(cr, hello, counts)
    finally:
        cr.remove("lazy", kill=True)


def test_eager_restore_copies_the_memory_in_with_many_threads_before_the_process_runs(criu_path, store_dir, tmp_path):
    """An eager restore (every GPU process's) hands the process back with all its memory in place:
    gpucr's page daemon copies it in while CRIU leaves the tree stopped, and the tree runs after.
    Its progress says when the whole image has been read (the server then reads the tensors)."""
    hello, counts = start_agent(store_dir, "filled", tmp_path, mb=400)
    cr = Checkpointer(store_dir, lazy_restore=False)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd")
    try:
        umask = _umask(cr.status("filled")["pid"])
        first = cr.checkpoint("filled")
        said: list[tuple[str, int, int]] = []
        running = cr.restore("filled", progress=lambda *step: said.append(step))
        size = first.size
        assert said == [("verifying", 0, size), ("restoring", 0, size), ("restoring", size, size), ("done", size, size)]
        assert _umask(running.pid) == umask, "the restored process must get its own umask back"
        assert json.loads((store_dir / "procs" / "filled" / ".pages").read_text()) == {"pages": "in"}
        assert "page_fill" in running.timings
        log = (first.path / "lazy-pages.log").read_text()
        copied = int(re.search(r"(\d+) bytes copied in by \d+ threads", log)[1])
        assert copied > 400 << 20, "the agent's memory did not come through the page daemon"
        for p in [first.path, *first.path.rglob("*")]:  # the restore's logs beside the memory stay private
            mode = stat.S_IMODE(p.stat().st_mode)
            assert mode == (0o700 if p.is_dir() else 0o600), f"{p} has mode {oct(mode)}"
        assert psutil.Process(running.pid).status() != psutil.STATUS_STOPPED
        assert ask(hello["port"])["checksum"] == hello["checksum"]
        cr.checkpoint("filled")
        cr.restore("filled")
        _same_and_counting(cr, hello, counts)
    finally:
        cr.remove("filled", kill=True)


TREE_SCRIPT = """
import hashlib, os, signal, sys, time
out = sys.argv[1]
a = bytearray(os.urandom(64 << 20))
if os.fork() == 0:
    a[: 32 << 20] = os.urandom(32 << 20)  # half of the inherited memory copied on write, half still shared
    b = bytearray(os.urandom(32 << 20))
    name, data = "child", lambda: a + b
else:
    name, data = "parent", lambda: a
def report(*_):
    with open(os.path.join(out, f"{name}.{os.getpid()}.sum"), "a") as f:
        f.write(hashlib.sha256(data()).hexdigest() + "\\n")
signal.signal(signal.SIGUSR1, report)
report()
while True:
    time.sleep(0.1)
"""


def _wait_for_tree(sums: Path) -> None:
    """Until TREE_SCRIPT's parent and child have each written their first checksum."""
    deadline = time.monotonic() + 30
    while [len(p.read_text().split()) for p in sums.glob("*.sum")] != [1, 1]:
        assert time.monotonic() < deadline, "the tree did not start"
        time.sleep(0.05)


def test_eager_restore_fills_every_process_of_a_tree(criu_path, store_dir, tmp_path):
    """A parent and its child, sharing part of their memory copy-on-write: the page daemon gets a
    userfaultfd per process and fills each one from its own pages."""
    cr = Checkpointer(store_dir, lazy_restore=False)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd")
    sums = tmp_path / "sums"
    sums.mkdir()
    cr.run("tree", [sys.executable, "-c", TREE_SCRIPT, str(sums)])
    try:
        _wait_for_tree(sums)
        before = {p.name.split(".")[0]: p.read_text().split()[0] for p in sums.glob("*.sum")}
        ckpt = cr.checkpoint("tree")
        running = cr.restore("tree")
        log = (ckpt.path / "lazy-pages.log").read_text()
        assert len(re.findall(r"^\(.*\) task \d+:", log, re.M)) == 2, log
        for p in tree(running.pid):
            os.kill(p, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not all(len(p.read_text().split()) == 2 for p in sums.glob("*.sum")):
            assert time.monotonic() < deadline, "the restored processes did not answer"
            time.sleep(0.05)
        after = {p.name.split(".")[0]: p.read_text().split()[1] for p in sums.glob("*.sum")}
        assert after == before
    finally:
        cr.remove("tree", kill=True)


def _gone_and_restorable(cr: Checkpointer, name: str, ckpt, hello: dict, monkeypatch) -> None:
    """After a restore that lost its memory: nothing of the restored tree is left, the name is
    recorded in its checkpoint, and (the fault undone) that checkpoint restores the same state."""
    status_arg = f"--status={cr.store.proc_dir(name) / '.status'}"
    deadline = time.monotonic() + 10
    while [p for p in psutil.process_iter(["cmdline"]) if status_arg in (p.info["cmdline"] or [])]:
        assert time.monotonic() < deadline, "the namespace of the restored process is still there"
        time.sleep(0.05)
    assert cr.status(name)["state"] == "checkpointed" and ckpt.path.is_dir()
    monkeypatch.undo()
    cr.restore(name)
    assert ask(hello["port"])["checksum"] == hello["checksum"]


@pytest.mark.parametrize("restored", [False, True], ids=["as started", "restored"])
def test_remove_with_kill_ends_every_process_of_the_tree(criu_path, store_dir, tmp_path, restored):
    """``remove --kill`` ends the whole tree, not only its root: a child left behind kept the
    namespace's init, and its own memory, alive for good."""
    cr = Checkpointer(store_dir, lazy_restore=False)
    sums = tmp_path / "sums"
    sums.mkdir()
    cr.run("tree", [sys.executable, "-c", TREE_SCRIPT, str(sums)])
    try:
        _wait_for_tree(sums)
        if restored:
            cr.checkpoint("tree")
            cr.restore("tree")
        init = psutil.Process(cr.status("tree")["pid"]).ppid()
        namespace = [psutil.Process(init).ppid(), *tree(init)]  # unshare, the init, the root and its child
        assert len(namespace) == 4, namespace
    finally:
        cr.remove("tree", kill=True)
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in namespace if not gone(p)] == []


def test_old_network_locks_are_released_at_the_next_checkpoint(criu_path, store_dir, tmp_path):
    """Each dump that stops its process leaves CRIU's network lock (an nftables table) until the
    restore, and a host has room for 1024: the locks of checkpoints older than the hold are released
    by the next checkpoint, and those checkpoints still restore."""
    old_hello, _ = start_agent(store_dir, "old", tmp_path, mb=10)
    new_hello, _ = start_agent(store_dir, "new", tmp_path, mb=10)
    cr = Checkpointer(store_dir, network_lock_hold=1.0)
    try:
        old = cr.checkpoint("old")
        if not _lock_of(old):
            pytest.skip("CRIU took no network lock here (no nftables)")
        time.sleep(1.2)
        new = cr.checkpoint("new")
        assert not _lock_of(old), "the old checkpoint's lock was kept"
        assert _lock_of(new), "the new checkpoint's lock was released before its hold"
        for name, hello in (("old", old_hello), ("new", new_hello)):
            cr.restore(name)
            assert ask(hello["port"])["checksum"] == hello["checksum"]
        assert not _lock_of(new), "the restore releases the lock"
    finally:
        cr.remove("old", kill=True)
        cr.remove("new", kill=True)


def _lock_of(ckpt) -> bool:
    did = dump_id(ckpt.images)
    return any(did.startswith(t.removeprefix("CRIU-")) for t in network_lock_tables())


@pytest.mark.parametrize(("when", "said"), [("task", "memory in stopped during the restore"), ("copying", "lost its memory")])
def test_failed_page_fill_fails_the_restore_and_keeps_the_checkpoint(criu_path, store_dir, tmp_path, monkeypatch, when, said):
    """The page daemon dies while CRIU restores the tree, or while the tree waits, stopped, for its
    memory: the restore fails saying so, nothing of the tree is left, and the checkpoint restores
    it again."""
    hello, _counts = start_agent(store_dir, "unfilled", tmp_path, mb=50)
    cr = Checkpointer(store_dir, lazy_restore=False)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd")
    real = cr.criu.page_fill_argv
    # Killed once its log says CRIU handed it the tree, or that it began copying.
    killer = '"$@" & d=$!; while ! grep -qs "$WHEN" "$LOG"; do sleep 0.001; done; kill -9 $d; wait $d; exit 9'
    monkeypatch.setattr(cr.criu, "page_fill_argv", lambda images, workdir: [
        "env", f"LOG={workdir / 'lazy-pages.log'}", f"WHEN={when}", "sh", "-c", killer, "sh", *real(images, workdir)])
    try:
        ckpt = cr.checkpoint("unfilled")
        with pytest.raises(EngineError) as err:
            cr.restore("unfilled")
        assert said in str(err.value) and ("checkpoint is intact" in str(err.value) or "checkpoint is kept" in str(err.value))
        _gone_and_restorable(cr, "unfilled", ckpt, hello, monkeypatch)
    finally:
        cr.remove("unfilled", kill=True)


def test_failed_lazy_pages_daemon_stops_the_process_and_keeps_its_checkpoint(criu_path, store_dir, tmp_path, monkeypatch):
    """Pages the daemon never delivered would read as zeros: the process must not run on with
    them. It is stopped, the user is told, and the checkpoint restores it again."""
    hello, _counts = start_agent(store_dir, "lost", tmp_path, mb=50)
    cr = Checkpointer(store_dir)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd for lazy restores")
    pages = store_dir / "procs" / "lost" / ".pages"
    real = cr.criu.lazy_pages_argv
    # The daemon is killed as soon as CRIU has restored the process and the holder said so.
    killer = f'"$@" & d=$!; while [ ! -s {pages} ]; do sleep 0.002; done; kill -9 $d; wait $d; exit 9'
    monkeypatch.setattr(cr.criu, "lazy_pages_argv", lambda images, workdir: ["sh", "-c", killer, "sh", *real(images, workdir)])
    try:
        ckpt = cr.checkpoint("lost")
        with pytest.raises(EngineError) as err:
            cr.restore("lost")
            cr.await_pages("lost")
        assert "lost its memory" in str(err.value) and "checkpoint is intact" in str(err.value)
        _gone_and_restorable(cr, "lost", ckpt, hello, monkeypatch)
    finally:
        cr.remove("lost", kill=True)


GIVE_UP_SCRIPT = """
import hashlib, json, mmap, os, sys, time
mode = sys.argv[1]
child = os.fork() if mode == "child" else None
if child == 0:  # holds memory of its own and exits the moment it is restored
    mine = mmap.mmap(-1, 128 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mine[:] = os.urandom(128 << 20)
    last = time.time()
    while time.time() - last < 0.5:
        last = time.time()
        time.sleep(0.002)
    os._exit(0)
keep, drop, gone = (mmap.mmap(-1, n << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for n in (256, 64, 64))
for m in (keep, drop, gone):
    for i in range(0, len(m), 16 << 20):
        m[i:i + (16 << 20)] = os.urandom(16 << 20)
print(json.dumps({"digest": hashlib.sha256(keep).hexdigest()}), flush=True)
last = time.time()
while True:  # back from a restore (the clock jumped): give memory up at once, while it is filled
    time.sleep(0.002)
    if time.time() - last > 0.5:
        if mode == "fork" and os.fork() == 0:
            os._exit(0)
        if child:
            os.waitpid(child, 0)
        drop.madvise(mmap.MADV_DONTNEED)
        gone.close()
        print(json.dumps({"digest": hashlib.sha256(keep).hexdigest(), "dropped": bytes(drop) == bytes(len(drop))}), flush=True)
    last = time.time()
"""


def _restored_lines(cr: Checkpointer, name: str, count: int) -> list[dict]:
    log = cr.store.proc_dir(name) / "stdout.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{name} printed {log.read_text()!r}; {_whereabouts(cr, name)}")


def _whereabouts(cr: Checkpointer, name: str) -> str:
    """What a process that stopped printing is doing (for a failure's message)."""
    status = cr.status(name)
    pid = status.get("pid")
    try:
        state = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("State:"))
        return f"record {status}, {state}, waiting in {Path(f'/proc/{pid}/wchan').read_text()!r}"
    except (OSError, StopIteration, TypeError):
        return f"record {status}, the process is gone"


@pytest.fixture
def suspended_to_run_while_filled(criu_path, store_dir, monkeypatch):
    """Start GIVE_UP_SCRIPT (``mode``) and checkpoint it; its restores continue it while its memory
    is filled, as a GPU process's are (there is no GPU here)."""
    cr = Checkpointer(store_dir, lazy_restore=False)
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd")
    monkeypatch.setattr(restore_step, "runs_while_filled", lambda used: True)
    names: list[str] = []

    def suspended(name: str, mode: str):
        names.append(name)
        cr.run(name, [sys.executable, "-c", GIVE_UP_SCRIPT, mode])
        hello = _restored_lines(cr, name, 1)[0]
        ckpt = cr.checkpoint(name)
        time.sleep(1)  # the process tells that it was restored by the clock's jump
        return cr, hello, ckpt

    yield suspended
    for name in names:
        cr.remove(name, kill=True)


def test_a_process_that_runs_while_its_memory_is_filled_keeps_it_and_what_it_gives_up_stays_given_up(
        suspended_to_run_while_filled):
    """A GPU process runs while the page daemon copies its memory in (the driver restores it):
    pages it touches come in a span at a time, memory it unmaps or drops (MADV_DONTNEED) is
    crossed off and never gets the image's old bytes. Here a CPU process does that at once."""
    cr, hello, ckpt = suspended_to_run_while_filled("busy", "give-up")
    running = cr.restore("busy")
    assert "page_fill_behind" in running.timings
    after = _restored_lines(cr, "busy", 2)[1]
    assert after == {"digest": hello["digest"], "dropped": True}
    log = (ckpt.path / "lazy-pages.log").read_text()
    given_up = int(re.search(r"(\d+) ranges given up", log)[1])
    assert given_up >= 2, f"the process gave nothing up while it was filled:\n{log}"


def test_a_process_that_forks_while_its_memory_is_filled_is_restored_again_stopped_until_filled(
        suspended_to_run_while_filled):
    """A fork while the memory is filled would need the child's memory filled too, which the page
    daemon does not follow: it fails that attempt (the tree is killed), and the restore is done
    again with the tree stopped until its memory is in; the process then forks as it likes."""
    cr, hello, ckpt = suspended_to_run_while_filled("forks", "fork")
    running = cr.restore("forks")
    log = (ckpt.path / "lazy-pages.log").read_text()
    assert "a fork or mremap" in log and log.count("restore finished") == 2, log
    assert running.timings["first_attempt"] > 0 and "page_fill" in running.timings
    assert _restored_lines(cr, "forks", 2)[1] == {"digest": hello["digest"], "dropped": True}
    assert cr.status("forks")["state"] == "running"


def test_a_child_that_exits_while_the_memory_is_filled_needs_none_of_it(suspended_to_run_while_filled):
    """A process of the tree may exit before its memory is all in (its copies find no process):
    the rest of the tree is restored whole. The child exits as soon as it runs after the restore;
    on a busy machine it may first run after the half-second fill, so the case is tried again then."""
    logs = []
    for attempt in range(4):
        name = f"parent-{attempt}"
        cr, hello, ckpt = suspended_to_run_while_filled(name, "child")
        cr.restore(name)
        assert _restored_lines(cr, name, 2)[1] == {"digest": hello["digest"], "dropped": True}
        logs.append((ckpt.path / "lazy-pages.log").read_text())
        if re.search(r"\b1 tasks exited meanwhile", logs[-1]):
            return
        assert re.search(r"\b0 tasks exited meanwhile", logs[-1]), logs[-1]  # filled before it ran: whole too
    pytest.fail("the child never exited while the memory was filled:\n" + "\n".join(logs))
