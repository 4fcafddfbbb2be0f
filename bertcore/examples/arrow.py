"""Arrow arrays from numpy and back, for the primitive and list columns of the shards,
without copies where possible and without pandas: pa.array(ndarray) and Array.to_numpy()
import pandas, half a second in each fresh worker process, although nothing here needs it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """(n+1,) int64 start offsets of n runs of `lengths` stored back to back, then the end."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


_NUMPY_TYPES = {
    pa.int8(): np.int8,
    pa.uint16(): np.uint16,
    pa.int32(): np.int32,
    pa.uint32(): np.uint32,
    pa.int64(): np.int64,
}


def numpy_dtype(type_: pa.DataType) -> np.dtype:
    """The numpy dtype of a primitive Arrow type used in the shards."""
    return np.dtype(_NUMPY_TYPES[type_])


def arrow_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A primitive Arrow array (no nulls) of `values` converted to `type_`."""
    data = np.ascontiguousarray(values, dtype=numpy_dtype(type_))
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])


def numpy_view(array: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of a primitive Arrow array without nulls."""
    dtype = numpy_dtype(array.type)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def list_array(offsets: np.ndarray, values: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """list<value_type> from offsets (n+1) and flat values."""
    return pa.ListArray.from_arrays(arrow_array(offsets, pa.int32()), arrow_array(values, value_type))
