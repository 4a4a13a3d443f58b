"""A failure's cause in plain words (``summary``) and whether asking again can succeed
(``retryable``): what JupyterLab shows first and which buttons it offers (docs/ui.md)."""
from __future__ import annotations

from jupyter_gpucr.core.criu.commands import explain_log
from jupyter_gpucr.core.errors import CheckpointDamagedError, EngineError, PreconditionError, StateError
from jupyter_gpucr.core.steps.restore_failures import restore_summary
from jupyter_gpucr.daemon.protocol import error_from


def test_errors_say_their_cause_and_whether_a_retry_can_help() -> None:
    damaged = CheckpointDamagedError("Checkpoint 590a9737-…-aaf3e3 is damaged: pages-1.img: checksum mismatch.", "…")
    assert damaged.to_dict()["summary"] == "The saved state is damaged" and damaged.to_dict()["retryable"] is False
    assert PreconditionError("Not enough disk.").to_dict()["retryable"] is True
    assert StateError("It is running.").to_dict() == {
        "error": "StateError", "message": "It is running.", "hint": "", "summary": "It is running.", "retryable": False}
    # through the daemon's protocol, unchanged
    again = error_from(EngineError("CRIU could not restore 'k': …", "h", summary="The disk is full").to_dict())
    assert (type(again), again.summary, again.retryable) == (EngineError, "The disk is full", True)
    assert error_from(damaged.to_dict()).retryable is False


def test_a_criu_log_is_summed_up_in_plain_words(tmp_path) -> None:
    log = tmp_path / "restore.log"
    log.write_text("(00.012) 11709: Error (criu/sk-inet.c:1): inet: Can't bind inet socket (id 5): "
                   "Address already in use\n")
    assert explain_log(log).summary == "A port the kernel had is in use by another process"
    log.write_text("(00.012) 11709: Error (criu/files-reg.c:2): File home/u/data.csv has bad size 10 (expect 20)\n")
    failure = explain_log(log)
    assert failure.summary == "The file /home/u/data.csv changed while the kernel was suspended"
    assert failure.raw.startswith("11709: Error")
    log.write_text("(00.012) 11709: Error (criu/x.c:3): something CRIU says\n")
    assert explain_log(log).summary == ""
    assert restore_summary("", []) == "The kernel's process could not be recreated"
    assert restore_summary("A port …", [(43463, "127.0.0.1", "PID 22484 of u (uid 1000)", 22484)]) == \
        "Port 43463 is used by PID 22484"
