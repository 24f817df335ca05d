"""Files the host writes: atomically, so that an interrupted write never leaves a half
written blob, checkpoint or model where the previous one was."""
import os
import secrets


def write_atomically(path: str, data: bytes) -> None:
    """Write a temporary file in the same directory, fsync it, then os.replace it over
    `path`: an interrupted write never leaves a half-written file there. Raises OSError."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
