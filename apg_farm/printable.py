"""Text a bed or an operator wrote, made safe to print on a terminal: escape sequences (CSI,
OSC such as a hyperlink or a window title, two-byte ones) removed whole, then every other
control character (C0 but newline and tab, DEL, C1). What is left cannot move the cursor,
retitle the window, or hide text; Rich markup is escaped apart (`rich.markup.escape`)."""

from __future__ import annotations

import re

# CSI (7- and 8-bit), OSC to its BEL or ST (7- and 8-bit, or to the end when unterminated),
# DCS/SOS/PM/APC strings, charset and other two-byte escapes.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """`text` as a string with no escape sequence and no control character but \\n and \\t."""
    if text is None:
        return ""
    return _CONTROL.sub("", _SEQUENCE.sub("", str(text)))
