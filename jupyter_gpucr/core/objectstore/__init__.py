"""Object storage: the bucket, sealing (encryption), streamed uploads, a checkpoint's transfer
in and out, the lease of a kernel, and retention."""
