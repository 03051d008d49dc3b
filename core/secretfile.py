"""Files that hold secrets: read only when nobody but their owner can read them, as ssh treats keys.

A secret file readable by the group or by others (mode ``0640``, ``0644``...) is refused with one
line naming the file, its mode and the fix (``chmod 600``); its contents never reach a message.
Used for the HA shared secret, the NameServer's credentials file and the broker's NameServer
secret.  :func:`private_mode_problem` is the check alone (for callers that read the file themselves).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tidemq.errors import ConfigError

#: Mode bits a secret file must not have: any permission for the group or for others.
GROUP_OTHER = 0o077
#: At most this many bytes are read from a secret file.
MAX_SECRET_FILE = 1 << 20


def private_mode_problem(path: str | os.PathLike[str], what: str = "secret file") -> str | None:
    """Why ``path`` is not private to its owner (None when it is, or does not exist).

    Windows has no such mode bits; there the check is skipped.
    """
    if os.name != "posix":
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # the reader says it cannot read it
    mode = stat.S_IMODE(st.st_mode)
    if mode & GROUP_OTHER:
        return (
            f"{what} {str(path)!r} is readable by others (mode {mode:04o}): "
            f"run chmod 600 {path} (it holds a secret, and so is refused as ssh refuses such keys)"
        )
    return None


def read_secret_file(path: str | os.PathLike[str], option: str, *, min_length: int = 1) -> str:
    """The text of the secret file ``path`` (one trailing newline stripped), or a one-line ConfigError.

    ``option`` names the setting in errors (``"[broker] secret_key_file"``).  The file must be
    private (:func:`private_mode_problem`), UTF-8, not empty and at least ``min_length`` characters.
    """
    p = Path(path).expanduser()
    problem = private_mode_problem(p)
    if problem:
        raise ConfigError(f"{option}: {problem}")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_SECRET_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"{option} = {str(path)!r}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_SECRET_FILE:
        raise ConfigError(f"{option} = {str(path)!r}: a secret file holds at most {MAX_SECRET_FILE} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{option} = {str(path)!r}: the secret is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"{option} = {str(path)!r}: the secret file is empty")
    if len(text) < min_length:
        raise ConfigError(
            f"{option} = {str(path)!r}: the secret is {len(text)} characters, it needs at least {min_length}"
        )
    return text


__all__ = ["GROUP_OTHER", "private_mode_problem", "read_secret_file"]
