"""A secret kept in a file that only this process's user can read, read again whenever the file changes.

A secret written into a configuration travels with it to whoever may read the configuration; a file
of its own keeps it apart, and lets a tool that rotates the secret (Vault Agent, a cron job) replace
the file without restarting the reader. So the file must be a regular file owned by this process's
effective user with no permission bit for its group or anyone else (0600 or 0400), named by an
absolute path (a relative one would resolve against wherever the process was started); anything
else is refused with the reason, never guessed at. Its content is one line of printable text: a
trailing newline is dropped, a control character inside refuses it (``text.normalise_token``).
"""

from __future__ import annotations

import logging
import os
import stat
import threading

from nomad_plugin.util.text import normalise_token

log = logging.getLogger(__name__)

#: Far above any token; a larger file is not a token file.
MAX_SECRET_BYTES = 4096


class SecretFileError(ValueError):
    """Why the file cannot give a secret (a sentence fragment: "is readable by other users ...")."""


def read_secret_file(path: str) -> str:
    """The secret in ``path``; ``SecretFileError`` saying what is wrong with the file."""
    if not path.startswith("/"):
        raise SecretFileError("is not an absolute path")
    try:  # O_NONBLOCK: a FIFO put there must not hang the reader; fstat judges what was opened
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise SecretFileError(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError("is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.geteuid():
            raise SecretFileError(f"is owned by uid {st.st_uid}, not the plugin's uid {os.geteuid()}")
        if mode & 0o077:
            raise SecretFileError(f"can be read or changed by other users (mode {mode:04o})")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretFileError(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileError(f"is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError("is not UTF-8 text") from None
    secret, problem = normalise_token(text)
    if problem is not None:
        raise SecretFileError(problem)
    if not secret.strip():
        raise SecretFileError("is empty")
    return secret


class SecretFile:
    """``path`` and the secret last read from it. ``current()`` reads the file again when its identity,
    size or times changed (a rename over it, an edit in place); a new content that cannot be used is
    logged once and the secret read before is kept. ``problem`` is why there is none at all."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self._what = path, what  # ``what`` names the file in the log (an option name)
        self._lock = threading.Lock()
        self._seen: tuple[int, ...] | None = None
        self.secret, self.problem = "", ""
        self.current()

    def current(self) -> str:
        with self._lock:
            try:
                st = os.stat(self.path)
                seen: tuple[int, ...] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            except OSError as exc:
                seen = (-1, exc.errno or 0)
            if seen == self._seen:
                return self.secret
            first, self._seen = self._seen is None, seen
            try:
                secret = read_secret_file(self.path)
            except SecretFileError as exc:
                if not self.secret:
                    self.problem = f"{self._what} {self.path} {exc}"
                else:
                    log.warning("%s %s changed but %s; what it held before is still used", self._what, self.path, exc)
                return self.secret
            if not first and secret != self.secret:
                log.info("%s %s changed: its new content is used from now on", self._what, self.path)
            self.secret, self.problem = secret, ""
            return secret
