"""Startup hook: teach gguf-py the BITCOS ggml types whenever ``gguf`` is imported, in any program.

Installed into site-packages with ``ggml_bitcos_gguf.pth`` (a ``.pth`` line that imports this module and calls
``install()``; ``site`` runs it at interpreter start, the mechanism setuptools' editable installs and
``distutils-precedence.pth`` use). It makes the stock gguf-py tools (``gguf-dump``, ``gguf-new-metadata``,
``gguf-set-metadata``, ``gguf.GGUFReader`` in any script) read and rewrite BITCOS files without the user
importing anything.

Cost at start-up: this module (standard library only, no ``gguf``/``numpy`` import) and one entry at the
front of ``sys.meta_path``. The finder does nothing until something imports ``gguf``; then it finds gguf's
own spec through the other finders, lets gguf's own loader execute the package unchanged, and afterwards
registers the BITCOS types (``gguf_tools.types.register_bitcos_types``, which holds the facts). It removes
itself from ``sys.meta_path`` at that point, so it acts once per process. The installed gguf package's files
are never touched.

When the registration cannot run right then (gguf imported while one of this project's own modules is
half-initialised, e.g. ``ggml_bitcos.format`` importing ``gguf.constants``), the enum's ``_missing_`` hook
registers the types at the first lookup of an unknown type id instead, i.e. when a file with a BITCOS tensor
is read. Set ``GGML_BITCOS_GGUF_HOOK=0`` to switch the hook off.
"""

from __future__ import annotations

import os
import sys

_ENV_SWITCH = "GGML_BITCOS_GGUF_HOOK"
_TARGET = "gguf"


def _register_now() -> None:
    """Register the BITCOS types with the already-executed ``gguf`` package (raises on failure)."""
    import importlib

    types = importlib.import_module("gguf_tools.types")  # registers on import (idempotent)
    types.register_bitcos_types()


def _install_missing_fallback() -> None:
    """Register at the first ``GGMLQuantizationType(unknown id)`` instead (see the module docstring)."""
    from gguf.constants import GGMLQuantizationType

    enum_cls = GGMLQuantizationType

    def _missing_(cls, value):  # noqa: ANN001, ANN202  (the Enum protocol: a member or None)
        _register_now()  # on failure the fallback stays for the next lookup
        type.__delattr__(enum_cls, "_missing_")  # back to Enum's own
        return cls._value2member_map_.get(value)

    type.__setattr__(enum_cls, "_missing_", classmethod(_missing_))


def _after_gguf_import() -> None:
    try:
        _register_now()
    except (ImportError, AttributeError):
        # one of this project's modules is half-initialised (it imported gguf; a name it defines later is
        # missing): register on first need
        _install_missing_fallback()
    except Exception as e:  # never break `import gguf`; say why BITCOS files will not read
        sys.stderr.write(
            f"ggml-bitcos: warning: could not register the BITCOS ggml types with gguf-py "
            f"({type(e).__name__}: {e}); gguf tools will not read BITCOS files\n"
        )


class _RegisteringLoader:
    """gguf's own loader, plus the registration after the package has executed."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        # the module keeps gguf's own loader (importlib.resources, reload, introspection see no wrapper)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _after_gguf_import()

    def __getattr__(self, name: str):  # noqa: ANN204  (is_package, get_resource_reader, ...)
        return getattr(self._loader, name)


class GGUFImportHook:
    """``sys.meta_path`` finder that acts on the import of the top-level ``gguf`` package only."""

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname != _TARGET:
            return None
        uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Called from the ``.pth`` file at interpreter start."""
    if os.environ.get(_ENV_SWITCH, "1") == "0":
        return
    if _TARGET in sys.modules:  # imported before this ran (e.g. by an earlier .pth file)
        _after_gguf_import()
        return
    if not any(isinstance(f, GGUFImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, GGUFImportHook())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, GGUFImportHook)]
