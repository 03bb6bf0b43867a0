"""Arrow tables between processes with their exact layout.

Plain pickling drops validity bitmaps that have no nulls (every `take` result has one),
which changes `Table.nbytes` and so where the dataset writers cut parts: rows built in
worker processes would be written to other parts than the same rows built inline. Here
each array goes with its own buffers, as they are, its children and its null count.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

ArrayState = tuple[pa.DataType, int, int, int, list[pa.Buffer | None], list[Any]]


def pack(table: pa.Table) -> tuple[pa.Schema, list[list[ArrayState]]]:
    return table.schema, [[_state(chunk) for chunk in column.chunks] for column in table.columns]


def unpack(schema: pa.Schema, columns: list[list[ArrayState]]) -> pa.Table:
    arrays = [pa.chunked_array([_array(s) for s in chunks], type=f.type) for f, chunks in zip(schema, columns)]
    return pa.Table.from_arrays(arrays, schema=schema)


def _state(array: pa.Array) -> ArrayState:
    kind = array.type
    if pa.types.is_list(kind):
        own, children = 2, [array.values]  # validity, offsets
    elif pa.types.is_struct(kind) and array.offset == 0:  # field() is sliced by the offset
        own, children = 1, [array.field(i) for i in range(kind.num_fields)]
    elif pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        raise TypeError(f"no exact transfer for {kind} at offset {array.offset}")
    else:
        own, children = len(array.buffers()), []
    return kind, len(array), array.offset, array.null_count, array.buffers()[:own], [_state(c) for c in children]


def _array(state: ArrayState) -> pa.Array:
    kind, length, offset, nulls, buffers, children = state
    known = nulls
    if buffers[0] is not None:
        nulls = -1  # a count of 0 given here would drop the bitmap
    array = pa.Array.from_buffers(kind, length, buffers, nulls, offset, [_array(c) for c in children] or None)
    if array.null_count != known:  # counted now: concatenation keeps the bitmaps of uncounted arrays
        raise ValueError(f"{kind}: {array.null_count} nulls, sent {known}")
    return array
