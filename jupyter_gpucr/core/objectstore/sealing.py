"""Client-side encryption of what gpucr puts into object storage (``c.GPUCR.encryption_key_file``).

AES-256-GCM from ``cryptography`` (pyca's ``AESGCM`` over OpenSSL: audited, maintained, with AES-NI).
An object is a header, then its plaintext in chunks of :data:`CHUNK` bytes, each sealed on its own::

    header   MAGIC (16 bytes) | format version (1) | chunk size (4, big-endian) | key id (8)
    chunk i  nonce (12, random) | ciphertext | GCM tag (16)

Each chunk's associated data is the header, the chunk's index, whether it is the last one, and the
object's name below the store (``USER/NAME/ID/...``): a chunk moved within or between objects, an
object renamed or copied into another user's prefix, or one cut short at a chunk's end does not
open. The last chunk holds the rest of the plaintext, possibly nothing, so n bytes take
``n // CHUNK + 1`` chunks and the stored size follows from the plaintext size alone: the parts of
an upload and the ranges of a download are whole chunks at computed offsets, so uploads stream
while CRIU writes and downloads read ranges in parallel as they do without a key.

The key id (8 bytes of a SHA-256 of the key) tells a restore with another key from a damaged object,
and picks among the operator's keys: new objects are sealed with the current key, and a checkpoint
sealed with a previous one (``c.GPUCR.previous_encryption_key_files``) is opened with that one, so
kernels suspended before a key rotation still restore.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import CheckpointDamagedError, GPUCRError

MAGIC = b"gpucr-aes256gcm\n"
VERSION = 1
#: Plaintext bytes per sealed chunk; a download's ranges and an upload's parts are multiples of it.
CHUNK = 4 << 20
KEY_BYTES = 32
NONCE = 12
TAG = 16
OVERHEAD = NONCE + TAG
HEADER = len(MAGIC) + 1 + 4 + 8
CIPHER = "AES-256-GCM"

MAKE_A_KEY = ("Make one with: (umask 077; head -c 32 /dev/urandom > KEYFILE), or openssl rand -out KEYFILE 32 "
              "then chmod 600 KEYFILE; keep a copy where the store's backups are not.")
SET_THE_KEY = "c.GPUCR.encryption_key_file (GPUCR_ENCRYPTION_KEY_FILE, gpucr --encryption-key-file)"
ADD_A_PREVIOUS_KEY = ("c.GPUCR.previous_encryption_key_files (GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES, "
                      "gpucr --previous-encryption-key-file)")


def key_file_from_environment() -> str:
    """The current key's file as ``GPUCR_ENCRYPTION_KEY_FILE`` names it ("" without one)."""
    return os.environ.get("GPUCR_ENCRYPTION_KEY_FILE", "")


def previous_key_files_from_environment() -> list[str]:
    """The previous keys' files as ``GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES`` names them (os.pathsep between)."""
    return [p for p in os.environ.get("GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES", "").split(os.pathsep) if p]


class EncryptionKeyError(GPUCRError):
    """The encryption key file is missing, unreadable, open to others or not a 256-bit key."""

    status = 500


class KeyMismatchError(GPUCRError):
    """An object was sealed with another key, or sealed while no key is set, or not sealed while one is."""

    status = 422


def load_key(path: str | os.PathLike[str]) -> StoreKey:
    """The key in ``path``: 32 raw bytes, 64 hex digits or base64 of 32 bytes. The file must be the
    user's own and closed to everyone else (0600 or 0400)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise EncryptionKeyError(f"The encryption key file {p} cannot be read: {e.strerror or e}.", MAKE_A_KEY) from e
    if not stat.S_ISREG(st.st_mode):
        raise EncryptionKeyError(f"The encryption key file {p} is not a regular file.", MAKE_A_KEY)
    if st.st_uid != os.geteuid():
        raise EncryptionKeyError(f"The encryption key file {p} belongs to uid {st.st_uid}, not to the user this runs "
                                 f"as (uid {os.geteuid()}).",
                                 f"Copy it to a file of this user's: install -m 600 {p} ~/.gpucr.key (on Kubernetes, "
                                 f"an init container running as the user does it; docs/storage.md).")
    if st.st_mode & 0o077:
        raise EncryptionKeyError(f"The encryption key file {p} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}).",
                                 f"chmod 600 {p}")
    try:
        secret = _parse(p.read_bytes())
    except OSError as e:
        raise EncryptionKeyError(f"The encryption key file {p} cannot be read: {e.strerror or e}.", MAKE_A_KEY) from e
    if secret is None:
        raise EncryptionKeyError(f"The encryption key file {p} does not hold a 256-bit key (32 raw bytes, 64 hex "
                                 f"digits, or base64 of 32 bytes).", MAKE_A_KEY)
    return StoreKey(secret, str(p))


def _parse(data: bytes) -> bytes | None:
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    try:
        if len(text) == 2 * KEY_BYTES:
            return bytes.fromhex(text.decode("ascii"))
        raw = base64.b64decode(text.replace(b"-", b"+").replace(b"_", b"/"), validate=True)
    except (ValueError, binascii.Error):
        return None
    return raw if len(raw) == KEY_BYTES else None


def sealed_size(size: int) -> int:
    """The stored size of ``size`` plaintext bytes."""
    return HEADER + size + (size // CHUNK + 1) * OVERHEAD


def _offset(index: int) -> int:
    return HEADER + index * (CHUNK + OVERHEAD)


def _last_chunk(start: int, end: int, size: int) -> int:
    """The index of the last chunk holding plaintext [start, end) of an object of ``size`` bytes."""
    if start % CHUNK or (end < size and end % CHUNK):
        raise ValueError(f"bytes {start}-{end} of {size} are not on chunk boundaries")
    return size // CHUNK if end >= size else end // CHUNK - 1


def sealed_range(start: int, end: int, size: int) -> tuple[int, int]:
    """The stored bytes [from, to) that hold plaintext [start, end) (the header too when ``start`` is 0)."""
    last = _last_chunk(start, end, size)
    return (0 if start == 0 else _offset(start // CHUNK)), _offset(last) + min(CHUNK, size - last * CHUNK) + OVERHEAD


class StoreKey:
    """The operator's key, sealing and opening objects named below the store."""

    def __init__(self, secret: bytes, source: str = "") -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as e:
            raise EncryptionKeyError(f"An encryption key is set ({source}), and the cryptography package is missing.",
                                     "Install the object store support: pip install 'jupyter-gpucr[s3]'.") from e
        self._aead = AESGCM(secret)
        self.id = hashlib.sha256(b"gpucr key id\0" + secret).hexdigest()[:16]
        self.source = source
        self.header = MAGIC + struct.pack(">BI", VERSION, CHUNK) + bytes.fromhex(self.id)

    def __repr__(self) -> str:
        return f"StoreKey(id={self.id}, file={self.source})"

    def record(self) -> dict[str, Any]:
        """What ``complete.json`` says of how its checkpoint was sealed."""
        return {"cipher": CIPHER, "format": VERSION, "chunk": CHUNK, "key_id": self.id}

    def _aad(self, name: str, index: int, final: bool) -> bytes:
        return self.header + struct.pack(">QB", index, final) + name.encode()

    # -- sealing ----------------------------------------------------------------------------
    def seal_span(self, name: str, read: Callable[[int, int], bytes], start: int, end: int, final: bool) -> bytes:
        """Plaintext [start, end) of object ``name`` (``read(offset, length)`` gives it) sealed, the
        header first when ``start`` is 0. ``start`` is on a chunk boundary; ``final``: ``end`` is the
        object's end (the rest, possibly nothing, becomes its last chunk), else ``end`` is on a boundary."""
        if start % CHUNK or (not final and end % CHUNK):
            raise ValueError(f"bytes {start}-{end} of {name} are not on chunk boundaries")
        out = [self.header] if start == 0 else []
        pos = start
        while end - pos >= CHUNK or final:
            length = min(CHUNK, end - pos)
            last = final and length < CHUNK
            data = read(pos, length)
            if len(data) != length:
                raise OSError(f"{name}: {len(data)} bytes read at {pos}, {length} expected")
            nonce = os.urandom(NONCE)
            out += [nonce, self._aead.encrypt(nonce, data, self._aad(name, pos // CHUNK, last))]
            pos += length
            if last:
                break
        return b"".join(out)

    def seal(self, name: str, data: bytes) -> bytes:
        return self.seal_span(name, lambda offset, length: data[offset:offset + length], 0, len(data), True)

    def seal_json(self, name: str, value: Any) -> str:
        """``value`` as JSON, sealed, in base64 (to sit inside a plaintext JSON record)."""
        return base64.b64encode(self.seal(name, json.dumps(value).encode())).decode()

    # -- opening ----------------------------------------------------------------------------
    def open_span(self, name: str, data: bytes, start: int, end: int, size: int, where: str = "") -> bytes:
        """Plaintext [start, end) of object ``name`` (``size`` plaintext bytes) from the stored bytes
        :func:`sealed_range` gives. Raises :class:`KeyMismatchError` when its header names another
        key, :class:`~.errors.CheckpointDamagedError` (naming ``where``) when a chunk does not open."""
        from cryptography.exceptions import InvalidTag

        where = where or name
        view = memoryview(data)
        pos = 0
        if start == 0:
            self.check_header(bytes(view[:HEADER]), where)
            pos = HEADER
        out = []
        last = size // CHUNK
        for index in range(start // CHUNK, _last_chunk(start, end, size) + 1):
            length = min(CHUNK, size - index * CHUNK) + OVERHEAD
            piece = view[pos:pos + length]
            pos += length
            if len(piece) != length:
                raise CheckpointDamagedError(f"The object {where} is damaged: it ends inside chunk {index}.",
                                             _DAMAGED_HINT)
            try:
                out.append(self._aead.decrypt(piece[:NONCE], piece[NONCE:], self._aad(name, index, index == last)))
            except InvalidTag as e:  # altered bytes, or bytes of another object or place
                raise CheckpointDamagedError(
                    f"The object {where} is damaged or was altered: its chunk {index} (plaintext bytes "
                    f"{index * CHUNK}-{index * CHUNK + length - OVERHEAD}) does not authenticate.", _DAMAGED_HINT) from e
        return b"".join(out)

    def open(self, name: str, data: bytes, where: str = "") -> bytes:
        """A whole sealed object's plaintext."""
        self.check_header(data[:HEADER], where or name)
        body = len(data) - HEADER
        size = body - OVERHEAD * ((body + CHUNK + OVERHEAD - 1) // (CHUNK + OVERHEAD))
        return self.open_span(name, data, 0, max(size, 0), max(size, 0), where)

    def open_json(self, name: str, text: str, where: str = "") -> Any:
        try:
            data = base64.b64decode(text, validate=True)
        except (ValueError, binascii.Error) as e:
            raise CheckpointDamagedError(f"The sealed record {where or name} is damaged: {e}.", _DAMAGED_HINT) from e
        return json.loads(self.open(name, data, where))

    def check_header(self, header: bytes, where: str) -> None:
        if not header.startswith(MAGIC):
            raise KeyMismatchError(f"{where} is not encrypted, and this store is read with an encryption key "
                                   f"({self.source}).", _UNSEALED_HINT)
        version, chunk = struct.unpack(">BI", header[len(MAGIC):len(MAGIC) + 5])
        if (version, chunk) != (VERSION, CHUNK):
            raise KeyMismatchError(f"{where} was sealed in format {version} with {chunk}-byte chunks, which this "
                                   f"gpucr does not read (format {VERSION}, {CHUNK}-byte chunks).",
                                   "Restore it with the gpucr version that made it.")
        theirs = header[len(MAGIC) + 5:HEADER].hex()
        if theirs != self.id:
            raise KeyMismatchError(*_other_key(where, theirs, self))


_DAMAGED_HINT = ("Restore an older checkpoint or start fresh; the object stays in the store as it is. Anyone who can "
                 "write to the bucket could have altered it: check its access log.")
_UNSEALED_HINT = (f"It was stored by a server without {SET_THE_KEY}. A server with a key restores only what its key "
                  f"sealed (an unencrypted object could have been put there by anyone who can write to the bucket): "
                  f"restore it from a server without the key, or shut the kernel down.")


def _other_key(what: str, theirs: str, key: StoreKey, previous: Sequence[StoreKey] = ()) -> tuple[str, str]:
    known = f"; its previous keys: {_ids(previous)}" if previous else ""
    return (f"{what} is encrypted with another key (id {theirs}); this server's key ({key.source}) has id {key.id}{known}.",
            f"Set {SET_THE_KEY} to the key it was made with, or add that key to {ADD_A_PREVIOUS_KEY}; the checkpoint "
            f"stays in the store as it is.")


def _ids(keys: Sequence[StoreKey]) -> str:
    return ", ".join(f"{k.id} ({k.source})" for k in keys)


def opening_key(key: StoreKey | None, previous: Sequence[StoreKey], record: dict[str, Any] | None,
                what: str) -> StoreKey | None:
    """The key that opens what ``record`` (``complete.json``'s ``encryption``, None for an unencrypted
    checkpoint) says was sealed: the current ``key`` or one of the ``previous`` ones, picked by the
    key id the record holds; None for an unencrypted checkpoint while no key is set. Raises
    :class:`KeyMismatchError` when none of them does."""
    if record is None:
        if key is not None:
            raise KeyMismatchError(f"{what} is not encrypted, and this store is read with an encryption key "
                                   f"({key.source}).", _UNSEALED_HINT)
        return None
    theirs = str(record.get("key_id"))
    opener = next((k for k in (key, *previous) if k is not None and k.id == theirs), None)
    if opener is None and key is not None:
        raise KeyMismatchError(*_other_key(what, theirs, key, previous))
    if opener is None:
        known = f"; previous keys: {_ids(previous)}" if previous else ""
        raise KeyMismatchError(f"{what} is encrypted (key id {theirs}) and no encryption key is set{known}.",
                               f"Set {SET_THE_KEY} to the key it was made with.")
    if record.get("format") != VERSION or record.get("chunk") != CHUNK:
        raise KeyMismatchError(f"{what} was sealed in format {record.get('format')}, which this gpucr does not read.",
                               "Restore it with the gpucr version that made it.")
    return opener
