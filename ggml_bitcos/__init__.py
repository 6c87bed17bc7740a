"""ggml-bitcos: the BITCOS ternary layout (presence bitmap + compacted signs) for llama.cpp / GGUF.

The format is specified in docs/FORMAT.md, its constants are in ggml_bitcos.format, and the numpy reference
codec is ggml_bitcos.codec.
"""

__version__ = "0.1.0"
