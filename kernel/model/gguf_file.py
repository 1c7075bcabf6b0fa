"""A GGUF file's header, read fast: metadata and tensor infos, the tensors as views of one
memory map (nothing is read until used).

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array when it
opens a file: a Gemma 3 or Llama 3 vocabulary (128k-262k tokens and as many merges) took it
~30 s, on every start. This reader walks the header once with ``struct`` (string arrays are
stepped over, not built) and decodes a field's value only when asked (``Field.contents``).
It keeps the names the model code reads: ``fields[key].contents()``, and ``tensors`` with
``name``, ``shape`` (GGUF order: the row length first), ``tensor_type`` and ``data`` (as
``GGUFReader`` shapes it: a typed array for float types, bytes per row for block types).
Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from fak.kernel.model.config import ModelError

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
# value type -> (struct format, size) of the fixed-size GGUF value types
SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
           7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
# float tensor types read as typed arrays (GGUFReader's shapes); every other type as bytes per row
FLOAT_DTYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                GGMLQuantizationType.F64: np.float64}


@dataclass(frozen=True)
class Field:
    """One metadata entry: where its value lies, decoded on demand."""

    buf: memoryview
    value_type: int
    offset: int

    def contents(self) -> Any:
        value, _ = _read_value(self.buf, self.value_type, self.offset)
        return value


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne0 (the row length) first
    tensor_type: GGMLQuantizationType
    data: np.ndarray


class GGUFFile:
    """The header of a GGUF file and its tensors as views of one read-only memory map."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ModelError(f"{self.path}: cannot read ({exc})") from exc
        buf = memoryview(self._map.data)
        try:
            self.fields, self.tensors = _parse(buf, self._map)
        except (struct.error, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise ModelError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def _string(buf: memoryview, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, at)
    at += 8
    return bytes(buf[at : at + n]).decode("utf-8"), at + n


def _read_value(buf: memoryview, value_type: int, at: int) -> tuple[Any, int]:
    if value_type in SCALARS:
        fmt, size = SCALARS[value_type]
        return struct.unpack_from(fmt, buf, at)[0], at + size
    if value_type == STRING:
        return _string(buf, at)
    if value_type == ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item_type in SCALARS:
            fmt, size = SCALARS[item_type]
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", buf, at))
            return values, at + count * size
        items = []
        for _ in range(count):
            item, at = _read_value(buf, item_type, at)
            items.append(item)
        return items, at
    raise ValueError(f"unknown GGUF value type {value_type}")


def _skip_value(buf: memoryview, value_type: int, at: int) -> int:
    """The offset past a value, without building it (string arrays are stepped over)."""
    if value_type in SCALARS:
        return at + SCALARS[value_type][1]
    if value_type == STRING:
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + int(n)
    if value_type == ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item_type in SCALARS:
            return int(at + count * SCALARS[item_type][1])
        for _ in range(count):
            at = _skip_value(buf, item_type, at)
        return at
    raise ValueError(f"unknown GGUF value type {value_type}")


def _parse(buf: memoryview, whole: np.ndarray) -> tuple[dict[str, Field], list[Tensor]]:
    if bytes(buf[:4]) != MAGIC:
        raise ValueError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read)")
    at = 24
    fields: dict[str, Field] = {}
    for _ in range(n_kv):
        key, at = _string(buf, at)
        (value_type,) = struct.unpack_from("<I", buf, at)
        at += 4
        fields[key] = Field(buf, value_type, at)
        at = _skip_value(buf, value_type, at)
    infos = []
    for _ in range(n_tensors):
        name, at = _string(buf, at)
        (n_dims,) = struct.unpack_from("<I", buf, at)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, at + 4)
        at += 4 + 8 * n_dims
        type_id, offset = struct.unpack_from("<IQ", buf, at)
        at += 12
        infos.append((name, tuple(int(d) for d in dims), GGMLQuantizationType(type_id), offset))
    align_field = fields.get("general.alignment")
    align = int(align_field.contents()) if align_field is not None else 32
    start = (at + align - 1) // align * align
    tensors = []
    for name, dims, qtype, offset in infos:
        values, size = GGML_QUANT_SIZES[qtype]
        if not dims or dims[0] % values:
            raise ValueError(f"tensor {name}: rows of {dims[:1]} values are not whole {qtype.name} blocks")
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // values * size
        raw = whole[start + offset : start + offset + rows * row_bytes]
        if raw.shape[0] != rows * row_bytes:
            raise ValueError(f"tensor {name} runs past the end of the file")
        if qtype in FLOAT_DTYPES:
            data = raw.view(FLOAT_DTYPES[qtype]).reshape(tuple(reversed(dims)))
        else:
            data = raw.reshape(*reversed(dims[1:]), row_bytes)
        tensors.append(Tensor(name, dims, qtype, data))
    return fields, tensors
