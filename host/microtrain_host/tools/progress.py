"""Progress bars for long commands (pack, train, deploy, federate), with no dependency.

A `Bar` draws one line on a terminal, redrawn in place with a carriage return:

    round 2/5 [##########..........]  50/100  0:04 elapsed, ~0:04 left  loss 0.512

On anything else (a pipe, a file, a test capturing output) it draws nothing, so what the
commands print line by line stays exactly as it was. The bar goes to stderr, results to
stdout; `clear()` wipes the bar before a result line is printed on the same terminal.
"""
import sys
import time


def _clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else \
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Bar:
    """update(label, done, total, note="") draws; clear() wipes. Redraws at most every
    `interval` seconds (always at done == total), so a tight loop can call it every step."""

    def __init__(self, stream=None, width=24, interval=0.1, enabled=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (enabled if enabled is not None
                        else bool(getattr(self.stream, "isatty", lambda: False)()))
        self.width, self.interval = width, interval
        self.shown = 0        # characters on the line now
        self.last = None      # time of the last redraw
        self.started = {}     # label -> time of its first update

    def update(self, label, done, total, note=""):
        if not self.enabled:
            return
        now = time.monotonic()
        start = self.started.setdefault(label, now)
        if self.last is not None and now - self.last < self.interval and done < total:
            return
        self.last = now
        total = max(total, 1)
        filled = min(self.width, int(self.width * done / total))
        elapsed = now - start
        text = (f"{label} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{done:>{len(str(total))}}/{total}  {_clock(elapsed)} elapsed")
        if 0 < done < total:
            text += f", ~{_clock(elapsed * (total - done) / done)} left"
        if note:
            text += "  " + note
        pad = max(0, self.shown - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self.shown = len(text) + pad

    def clear(self):
        if self.enabled and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0
