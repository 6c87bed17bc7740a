"""GGUF reading and writing for ggml-bitcos, on top of gguf-py (PyPI ``gguf``).

Importing this package registers the BITCOS ggml types (160 ``BITCOS_G128``, 161 ``BITCOS_PT``, 162 ``BITCOS``) with
gguf-py, so ``gguf.GGUFReader`` and ``gguf.GGUFWriter`` accept them everywhere in the process.
"""

from .types import (
    BITCOS,
    BITCOS_G128,
    BITCOS_PT,
    BITCOS_TYPES,
    bitcos_type,
    is_known_type,
    register_bitcos_types,
    tensor_nbytes,
    type_name,
)
from .reader import (
    CheckedGGUFReader,
    GGUFError,
    SourceTensor,
    field_value,
    open_gguf,
    tensor_bytes,
    tensor_form,
    tensor_ggml_shape,
    tensor_row_bytes,
    tensor_rows_cols,
)
from .writer import GGUFStreamWriter

__all__ = [
    "BITCOS",
    "BITCOS_G128",
    "BITCOS_PT",
    "BITCOS_TYPES",
    "bitcos_type",
    "is_known_type",
    "register_bitcos_types",
    "type_name",
    "CheckedGGUFReader",
    "GGUFError",
    "SourceTensor",
    "field_value",
    "open_gguf",
    "tensor_bytes",
    "tensor_form",
    "tensor_ggml_shape",
    "tensor_row_bytes",
    "tensor_rows_cols",
    "GGUFStreamWriter",
    "tensor_nbytes",
]
