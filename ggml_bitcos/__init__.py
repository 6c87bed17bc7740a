"""ggml-bitcos: the BITCOS ternary layout (presence bitmap + compacted signs) for llama.cpp / GGUF.

The format is specified in docs/FORMAT.md; the numpy reference codec is ggml_bitcos.codec.
"""

__version__ = "0.1.0"
