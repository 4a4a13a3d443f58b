"""CRIU: its commands and error translation, its image files, gpucr's lazy-pages daemon, huge
pages after a restore, and whether a checkpoint's node fits this one."""
