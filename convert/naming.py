"""The one place where text from a model file becomes part of generated code or names.

A model file is written by a stranger: any layer, blob or net name, and the file's own path, may
hold quotes, line breaks, ``\"\"\"``, control characters, rich markup or look-alike Unicode. Nothing
of it may reach generated source except through these functions:

- ``Names``: Python identifiers for names (ASCII only, so NFKC normalisation cannot merge two of
  them; never a keyword, a builtin, a reserved name or a private ``_name``; unique among those
  already given out);
- ``inert``: one line of text for a comment or a docstring (line breaks, quotes, backslashes and
  control characters escaped);
- ``repr()`` for string literals.

``printable`` does the same for text printed on a terminal (no escape sequences, bounded length).
"""

from __future__ import annotations

import builtins
import keyword
import re
import unicodedata
from collections.abc import Iterable

_NON_IDENT = re.compile(r"[^0-9A-Za-z_]+")
MAX_IDENT = 60  # readable names; longer ones are cut and made unique by a suffix


class Names:
    """Gives out unique Python identifiers derived from arbitrary names."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self.taken: set[str] = set(reserved)

    def get(self, name: str, fallback: str = "x") -> str:
        """A fresh identifier that reads like ``name``; never one given out or reserved before."""
        base = ascii_ident(name, fallback)
        ident, k = base, 1
        while ident in self.taken or keyword.iskeyword(ident) or keyword.issoftkeyword(ident):
            k += 1
            ident = f"{base}_{k}"
        self.taken.add(ident)
        return ident


def ascii_ident(name: str, fallback: str = "x") -> str:
    """``name`` as an ASCII identifier: accents dropped, other characters become ``_``; no leading
    digit or underscore (private and dunder names of ``nn.Module`` stay out of reach)."""
    decomposed = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode()
    s = _NON_IDENT.sub("_", decomposed).strip("_")[:MAX_IDENT].rstrip("_") or fallback
    return f"l{s}" if s[0].isdigit() else s


# Public attributes of ``torch.nn.Module`` (class and instance): a submodule stored under one of
# these names would shadow it (``self.forward = nn.Conv2d(...)`` recurses forever). A test keeps
# the list in step with the installed torch; private names are unreachable (``ascii_ident``).
MODULE_ATTRS = frozenset("""
T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter get_submodule
half ipu load_state_dict modules mtia named_buffers named_children named_modules named_parameters
parameters register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
register_load_state_dict_pre_hook register_module register_parameter register_state_dict_post_hook
register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule share_memory state_dict
to to_empty train training type xpu zero_grad
""".split())


def python_reserved(*extra: Iterable[str]) -> set[str]:
    """Names a generated local variable must not take: builtins, keywords, ``self`` and the
    module-level names of the generated file."""
    names = set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist) | {"self"}
    for e in extra:
        names |= set(e)
    return names


_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def inert(text: object, limit: int = 200) -> str:
    """One line that is safe inside a ``#`` comment or a ``\"\"\"`` docstring of generated code."""
    t = str(text)
    s = repr(t[:limit])[1:-1].replace('"', '\\"')  # cut before escaping: no half escape
    return s + ("..." if len(t) > limit else "")


def printable(text: object, limit: int = 2000) -> str:
    """Text for a terminal: escape sequences removed, other characters that do not print (line
    breaks, controls, bidirectional overrides) shown as spaces, at most ``limit`` characters."""
    s = _ANSI.sub("", str(text))
    cut = "".join(ch if ch.isprintable() else " " for ch in s[:limit])
    return cut if len(s) <= limit else cut + f"... ({len(s) - limit} more characters)"
