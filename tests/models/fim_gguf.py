"""A copy of a GGUF model that can fill in the middle: its metadata and tensors as they
are, and the three fill-in-the-middle token ids added under the keys llama.cpp reads
(``tokenizer.ggml.fim_pre_token_id`` and its siblings). Neither default model has the
tokens (SmolLM2's vocabulary has StarCoder's ``<file_sep>`` and ``<repo_name>`` but no
``<fim_prefix>``; Gemma 3's has none), so the real llama-server answers their
``/infill`` with 501: this copy of SmolLM2, with three of its unused special tokens
named as the FIM tokens, is one it answers. What it fills in is no useful code (the
model never learnt the format), but it is llama-server's own infill answer, through
the same prompt layout, which is what the tests compare.
"""

from __future__ import annotations

from pathlib import Path

import gguf

# SmolLM2's <jupyter_start>, <jupyter_text>, <jupyter_code>: special tokens no chat or
# completion of the tests uses.
PREFIX_ID, SUFFIX_ID, MIDDLE_ID = 11, 12, 13


def with_fim_tokens(source: Path, target: Path) -> Path:
    """``source`` written to ``target`` with the FIM token ids added; returns ``target``."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    assert isinstance(arch, str)
    writer = gguf.GGUFWriter(target, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_PRE_ID, PREFIX_ID)
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_SUF_ID, SUFFIX_ID)
    writer.add_uint32(gguf.Keys.Tokenizer.FIM_MID_ID, MIDDLE_ID)
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name,
            tensor.data.shape,
            tensor.data.dtype,
            tensor.data.nbytes,
            tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return target
