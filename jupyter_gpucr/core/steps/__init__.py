"""The steps the checkpointer's verbs run (:class:`~jupyter_gpucr.core.checkpointer.Checkpointer`):
the dump, putting a process back, the restore and why one failed, the waits for a restore's
memory, CRIU's network locks, and whether a checkpoint fits this node."""
