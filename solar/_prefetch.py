"""``prefetch(a, i)``: a hint, inside a compiled kernel, that row ``i`` of array ``a`` is read
soon (LLVM's ``llvm.prefetch``: a load that never faults and changes nothing).

A kernel whose next read's address is known a few iterations ahead but whose loop body is too
long for the CPU to run ahead to it (a neighbour sampler's frontier: ``indptr[v]``, then
``indices[indptr[v]]``, with a table probe per neighbour between) waits out each miss in turn;
asked a few iterations early, the misses overlap (issue 47: a third of the sampler's time at
10^6 nodes). Only the address is computed: ``i`` out of range prefetches nothing useful and
is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _prefetch(typingctx: Any, arr: Any, i: Any) -> Any:
    """Hint that ``arr[i]`` (row ``i``: the first dimension's stride) is read soon."""
    if not isinstance(arr, types.Array) or arr.ndim == 0 or not isinstance(i, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aty, ity = signature.args
        a, idx = args
        ary = context.make_array(aty)(context, builder, a)
        stride = cgutils.unpack_tuple(builder, ary.strides, aty.ndim)[0]
        if idx.type.width < 64:
            idx = builder.sext(idx, _I64) if ity.signed else builder.zext(idx, _I64)
        at = builder.add(builder.ptrtoint(ary.data, _I64), builder.mul(idx, stride))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]),
            "llvm.prefetch.p0i8",
        )  # fmt: skip
        # (a read, the highest locality, a data cache)
        builder.call(fn, [builder.inttoptr(at, _I8P), _I32(0), _I32(3), _I32(1)])
        return context.get_dummy_value()

    return types.void(arr, i), codegen


# (Called in a kernel as ``prefetch(a, i)``: numba gives the typing context.)
prefetch = cast(Callable[[Any, Any], None], intrinsic(_prefetch))
