"""Rank text as a terminal shows it: control characters escaped where they can be seen (pure).

A rank's output used to reach the console byte for byte, so a rank could drive the terminal:
``ESC[1A ESC[2K`` moved up and erased another rank's ``loss nan`` line, and the text after it
printed a ``[host:0]`` line of its own making. Everything that could do that is shown as
visible escapes instead (``\\x1b[1A``): C0 controls but the tab, DEL, C1 controls, the bidi
overrides that reorder what follows (``\\u202e``), the line and paragraph separators, and
bytes that are not UTF-8 (``\\xff``: a lone ``0x9b`` is an 8-bit CSI to some terminals).
Colours stay colours: an SGR sequence of colours and the plain attributes (bold, dim,
italic, underline, reverse) is kept on a colour console, with a reset at the end of the
line so it cannot colour anything after it, and dropped on a plain one (``--no-color``, a
pipe); conceal (which hides text) and everything else is escaped. The rank logs keep every
byte; this is only how the console, the live view, the failure report and ``zlaunch logs``
show a line.
"""

from __future__ import annotations

import re

__all__ = ["shown", "shown_block"]

_RESET = "\x1b[0m"
# What may drive a terminal. \udc80-\udcff: bytes that were not UTF-8 (surrogateescape).
_UNSAFE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\udc80-\udcff]"
)
_SGR = re.compile(r"\x1b\[([0-9;]{0,32})m")
_PLAIN_ATTRIBUTES = {0, 1, 2, 3, 4, 7, 22, 23, 24, 27, 39, 49}
_COLOURS = set(range(30, 38)) | set(range(40, 48)) | set(range(90, 98)) | set(range(100, 108))


def _harmless_sgr(params: str) -> bool:
    """Colours and plain attributes only (256-colour and RGB forms included)."""
    if not params:
        return True  # ESC[m: reset
    codes = params.split(";")
    if any(not code.isdigit() for code in codes):
        return False
    numbers = [int(code) for code in codes]
    index = 0
    while index < len(numbers):
        code = numbers[index]
        if code in (38, 48):  # 38;5;N or 38;2;R;G;B
            kind = numbers[index + 1] if index + 1 < len(numbers) else None
            width = {5: 1, 2: 3}.get(kind)  # type: ignore[arg-type]
            values = numbers[index + 2 : index + 2 + (width or 0)]
            if width is None or len(values) != width or any(v > 255 for v in values):
                return False
            index += 2 + width
            continue
        if code not in _PLAIN_ATTRIBUTES and code not in _COLOURS:
            return False
        index += 1
    return True


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def shown(text: str, color: bool = False) -> str:
    """One line as the console shows it (see the module's docstring); ``color``: the console
    draws colours, so a rank's harmless colours are kept."""
    if _UNSAFE.search(text) is None:
        return text  # the common line: nothing to do, one regex scan
    out: list[str] = []
    coloured = False
    pos = 0
    for match in _UNSAFE.finditer(text):
        start = match.start()
        if start < pos:
            continue  # inside an SGR sequence already taken
        out.append(text[pos:start])
        sgr = _SGR.match(text, start) if match.group() == "\x1b" else None
        if sgr is not None and _harmless_sgr(sgr.group(1)):
            if color:
                out.append(sgr.group())
                coloured = True
            pos = sgr.end()
            continue
        out.append(_escaped(match.group()))
        pos = start + 1
    out.append(text[pos:])
    if coloured:
        out.append(_RESET)
    return "".join(out)


def shown_block(text: str, color: bool = False) -> str:
    """Text of several lines (a note, a report): each line as `shown` makes it."""
    if _UNSAFE.search(text) is None:
        return text
    return "\n".join(shown(line, color) for line in text.split("\n"))
