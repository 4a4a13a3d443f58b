"""The local store: checkpoint and process folders, manifests, checksums and write-back, locks,
names, the page cache, and the open files a checkpoint keeps."""
