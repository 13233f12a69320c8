"""Sixteen sessions in vector registers: numba types of 16 lanes (float32, int64 and
bool) and the operations on them that :func:`jaxmarket.sessions.kernel._run_sessions`
plays a period of 16 sessions with, each an LLVM vector instruction (a 512-bit register
where the processor has AVX-512; LLVM splits it elsewhere, with the same results).

A lane's arithmetic is the scalar loop's, one rounding per operation: ``fadd``,
``fsub``, ``fmul``, ``fdiv`` (IEEE, rounded to nearest), ``ffma`` (one rounding), the
float control of the calling thread (flush-to-zero on x86, :func:`ftz` elsewhere).
``gather_*`` read ``array.flat[index]`` per lane and ``scatter_*`` write it, only in the
lanes of a mask (the others read 0 and write nothing): the lanes of one scatter must
name different elements (here: different sessions' tables)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic, models, register_model

#: sessions a vector holds
LANES = 16

_ELEMENT = {"f32": ir.FloatType(), "i64": ir.IntType(64), "bool": ir.IntType(1)}


class Lanes(types.Type):
    """16 lanes of float32 (``"f32"``), int64 (``"i64"``) or bool (``"bool"``)."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"lanes16_{kind}")


F32, I64, BOOL = Lanes("f32"), Lanes("i64"), Lanes("bool")


@register_model(Lanes)
class _LanesModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_ELEMENT[fe_type.kind], LANES))


def _vec(kind: str) -> ir.VectorType:
    return ir.VectorType(_ELEMENT[kind], LANES)


def _splat(builder, value, lanes: int = LANES):
    """``value`` in every lane."""
    vec = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value,
                                 ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), lanes),
                                                        [0] * lanes))


def _declare(builder, name: str, ret, args):
    return builder.module.globals.get(name) or ir.Function(
        builder.module, ir.FunctionType(ret, args), name)


def _binary(kind_in: str, kind_out: str, build):
    """An intrinsic ``(a, b) -> c`` on two vectors of ``kind_in``."""
    lanes_in, lanes_out = Lanes(kind_in), Lanes(kind_out)

    @intrinsic
    def op(typingctx, a, b):
        if a != lanes_in or b != lanes_in:
            return None

        def codegen(context, builder, signature, args):
            return build(builder, *args)

        return lanes_out(a, b), codegen

    return op


fadd = _binary("f32", "f32", lambda b, x, y: b.fadd(x, y))
fsub = _binary("f32", "f32", lambda b, x, y: b.fsub(x, y))
fmul = _binary("f32", "f32", lambda b, x, y: b.fmul(x, y))
fdiv = _binary("f32", "f32", lambda b, x, y: b.fdiv(x, y))
flt = _binary("f32", "bool", lambda b, x, y: b.fcmp_ordered("<", x, y))
fgt = _binary("f32", "bool", lambda b, x, y: b.fcmp_ordered(">", x, y))
feq = _binary("f32", "bool", lambda b, x, y: b.fcmp_ordered("==", x, y))
#: ``x if x > y else y``
fmax = _binary("f32", "f32", lambda b, x, y: b.select(b.fcmp_ordered(">", x, y), x, y))
iadd = _binary("i64", "i64", lambda b, x, y: b.add(x, y))
imul = _binary("i64", "i64", lambda b, x, y: b.mul(x, y))
#: ``x // y`` of non-negative lanes
idiv = _binary("i64", "i64", lambda b, x, y: b.sdiv(x, y))
iand = _binary("i64", "i64", lambda b, x, y: b.and_(x, y))
imin = _binary("i64", "i64", lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y))
ilt = _binary("i64", "bool", lambda b, x, y: b.icmp_signed("<", x, y))
ige = _binary("i64", "bool", lambda b, x, y: b.icmp_signed(">=", x, y))
ieq = _binary("i64", "bool", lambda b, x, y: b.icmp_signed("==", x, y))
ine = _binary("i64", "bool", lambda b, x, y: b.icmp_signed("!=", x, y))
band = _binary("bool", "bool", lambda b, x, y: b.and_(x, y))
bor = _binary("bool", "bool", lambda b, x, y: b.or_(x, y))


def _unary(argument, result, build):
    """An intrinsic ``(a) -> b`` on one value of numba type ``argument``."""

    @intrinsic
    def op(typingctx, a):
        if a != argument:
            return None

        def codegen(context, builder, signature, args):
            return build(builder, args[0])

        return result(a), codegen

    return op


#: each lane negated
bnot = _unary(BOOL, BOOL, lambda b, x: b.xor(x, ir.Constant(_vec("bool"), [1] * LANES)))


@intrinsic
def ffma(typingctx, a, b, c):
    """``a b + c`` rounded once."""
    if not (a == b == c == F32):
        return None

    def codegen(context, builder, signature, args):
        vec = _vec("f32")
        return builder.call(_declare(builder, "llvm.fma.v16f32", vec, [vec] * 3), list(args))

    return F32(a, b, c), codegen


def _select(kind: str):
    lanes = Lanes(kind)

    @intrinsic
    def select(typingctx, mask, a, b):
        """``a`` in the lanes of ``mask``, else ``b``."""
        if mask != BOOL or a != lanes or b != lanes:
            return None

        def codegen(context, builder, signature, args):
            return builder.select(*args)

        return lanes(mask, a, b), codegen

    return select


fsel, isel = _select("f32"), _select("i64")


@intrinsic
def splat_f(typingctx, x):
    """``x`` (float32) in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, args[0])

    return F32(x), codegen


@intrinsic
def splat_i(typingctx, x):
    """``x`` (an integer, as int64) in every lane."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.int64))

    return I64(x), codegen


@intrinsic
def iota(typingctx):
    """``0, 1, ..., 15``: each lane's number."""
    def codegen(context, builder, signature, args):
        return ir.Constant(_vec("i64"), list(range(LANES)))

    return I64(), codegen


#: each lane's unsigned integer (below 2^32) as the nearest float32, as a scalar
#: ``float32(uint32)``
u2f = _unary(I64, F32, lambda b, x: b.uitofp(x, _vec("f32")))
#: each lane truncated to int32 (as a scalar ``int32(x)``), as int64
f2i = _unary(F32, I64, lambda b, x: b.sext(
    b.fptosi(x, ir.VectorType(ir.IntType(32), LANES)), _vec("i64")))
#: the mask as an integer: bit ``l`` set where lane ``l`` is
mask_bits = _unary(BOOL, types.int64,
                   lambda b, x: b.zext(b.bitcast(x, ir.IntType(LANES)), ir.IntType(64)))
#: the index of the lowest set bit of ``x > 0``
lowest_bit = _unary(types.int64, types.int64,
                    lambda b, x: b.cttz(x, ir.Constant(ir.IntType(1), 1)))


@intrinsic
def extract_i(typingctx, v, lane):
    """Lane ``lane`` of the int64 lanes ``v``."""
    if v != I64 or not isinstance(lane, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.extract_element(args[0], args[1])

    return types.int64(v, lane), codegen


def _array_ok(arr, dtype) -> bool:
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype == dtype


def _load_store(kind: str, dtype):
    lanes = Lanes(kind)

    @intrinsic
    def load(typingctx, arr, offset):
        """``arr.flat[offset:offset + 16]`` as lanes."""
        if not _array_ok(arr, dtype) or not isinstance(offset, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            return builder.load(builder.bitcast(ptr, _vec(kind).as_pointer()), align=4)

        return lanes(arr, offset), codegen

    @intrinsic
    def store(typingctx, arr, offset, v):
        """``arr.flat[offset:offset + 16] = v``."""
        if not _array_ok(arr, dtype) or not isinstance(offset, types.Integer) or v != lanes:
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            builder.store(args[2], builder.bitcast(ptr, _vec(kind).as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(arr, offset, v), codegen

    return load, store


load_f, store_f = _load_store("f32", types.float32)
load_i, store_i = _load_store("i64", types.int64)


def _pointers(builder, data, index, element):
    """The addresses ``data + 4 index`` of each lane (4-byte elements)."""
    i64 = ir.IntType(64)
    base = _splat(builder, builder.ptrtoint(data, i64))
    offset = builder.mul(index, ir.Constant(_vec("i64"), [4] * LANES))
    return builder.inttoptr(builder.add(base, offset), ir.VectorType(element.as_pointer(), LANES))


def _gather(dtype, element, widen):
    """An intrinsic ``(arr, index, mask) -> lanes``: ``arr.flat[index]`` in the lanes of
    ``mask`` (4-byte elements), widened to the lanes' type by ``widen``."""
    out = F32 if dtype == types.float32 else I64
    tag = "f32" if dtype == types.float32 else "i32"

    @intrinsic
    def gather(typingctx, arr, index, mask):
        if not _array_ok(arr, dtype) or index != I64 or mask != BOOL:
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            vec = ir.VectorType(element, LANES)
            ptrs = _pointers(builder, ary.data, args[1], element)
            fn = _declare(builder, f"llvm.masked.gather.v16{tag}.v16p0", vec,
                          [ptrs.type, ir.IntType(32), _vec("bool"), vec])
            got = builder.call(fn, [ptrs, ir.Constant(ir.IntType(32), 4), args[2],
                                    ir.Constant(vec, [0] * LANES)])
            return widen(builder, got)

        return out(arr, index, mask), codegen

    return gather


gather_f = _gather(types.float32, ir.FloatType(), lambda b, x: x)
gather_i32 = _gather(types.int32, ir.IntType(32), lambda b, x: b.sext(x, _vec("i64")))
gather_u32 = _gather(types.uint32, ir.IntType(32), lambda b, x: b.zext(x, _vec("i64")))


def _scatter(dtype, element, narrow):
    """An intrinsic ``(arr, index, value, mask)``: ``arr.flat[index] = value`` in the
    lanes of ``mask`` (different elements in each lane)."""
    lanes = F32 if dtype == types.float32 else I64
    tag = "f32" if dtype == types.float32 else "i32"

    @intrinsic
    def scatter(typingctx, arr, index, value, mask):
        if not _array_ok(arr, dtype) or index != I64 or value != lanes or mask != BOOL:
            return None

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            vec = ir.VectorType(element, LANES)
            ptrs = _pointers(builder, ary.data, args[1], element)
            fn = _declare(builder, f"llvm.masked.scatter.v16{tag}.v16p0", ir.VoidType(),
                          [vec, ptrs.type, ir.IntType(32), _vec("bool")])
            builder.call(fn, [narrow(builder, args[2]), ptrs, ir.Constant(ir.IntType(32), 4),
                              args[3]])
            return context.get_dummy_value()

        return types.void(arr, index, value, mask), codegen

    return scatter


scatter_f = _scatter(types.float32, ir.FloatType(), lambda b, x: x)
scatter_i32 = _scatter(types.int32, ir.IntType(32),
                       lambda b, x: b.trunc(x, ir.VectorType(ir.IntType(32), LANES)))

_FLT_MIN = np.float32(np.finfo(np.float32).tiny)


@njit
def ftz(x):
    """Each lane flushed to a zero of its sign where it is a denormal (what x86's
    flush-to-zero does in hardware): ``x * 0`` where ``-FLT_MIN < x < FLT_MIN`` and
    ``x != 0``."""
    small = band(flt(x, splat_f(_FLT_MIN)), fgt(x, splat_f(-_FLT_MIN)))
    return fsel(small, fmul(x, splat_f(np.float32(0.0))), x)


#: columns :func:`_block_argmax` compares at once
BLOCK = 16


@intrinsic
def _block_argmax(typingctx, q, offset, base, m, at, value):
    """``(q, offset, base, m, at, value) -> c``: the first column ``c`` of
    ``base .. min(base + 16, m) - 1`` of the row at flat element ``offset`` of the
    C-contiguous float32 array ``q`` where the row is largest, column ``at`` read as
    ``value`` (the row before ``value`` is written there), in vector registers without a
    branch. A masked load reads the columns (none past ``m - 1``, so none outside the
    array); the maximum is found by pairwise ``a if a > b else b`` (exact; signed zeros
    and, with denormals read as zero, denormals compare equal), its first column by the
    lowest set bit of ``row == max``: the column a scan in order with ``>`` keeps."""
    if not _array_ok(q, types.float32):
        return None
    sig = types.intp(q, types.intp, types.intp, types.intp, types.intp, types.float32)

    def codegen(context, builder, signature, args):
        lanes = BLOCK
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        f32v = ir.VectorType(ir.FloatType(), lanes)
        i64v = ir.VectorType(ir.IntType(64), lanes)
        idx = ir.VectorType(ir.IntType(32), lanes)
        mask = ir.VectorType(ir.IntType(1), lanes)
        col = builder.add(ir.Constant(i64v, list(range(lanes))), _splat(builder, args[2], lanes))
        inside = builder.icmp_signed("<", col, _splat(builder, args[3], lanes))
        ptr = builder.gep(ary.data, [builder.add(args[1], args[2])])
        ptr = builder.bitcast(ptr, f32v.as_pointer())
        load = _declare(builder, "llvm.masked.load.v16f32.p0", f32v,
                        [ptr.type, ir.IntType(32), mask, f32v])
        x = builder.call(load, [ptr, ir.Constant(ir.IntType(32), 4), inside,
                                ir.Constant(f32v, [float("-inf")] * lanes)])
        x = builder.select(builder.icmp_signed("==", col, _splat(builder, args[4], lanes)),
                           _splat(builder, args[5], lanes), x)
        top, width = x, lanes
        while width > 1:   # pairwise maxima: lane 0 ends with the largest
            width //= 2
            hi = builder.shuffle_vector(top, top, ir.Constant(
                idx, [width + (lane % width) for lane in range(lanes)]))
            top = builder.select(builder.fcmp_ordered(">", top, hi), top, hi)
        top = builder.shuffle_vector(top, top, ir.Constant(idx, [0] * lanes))
        hit = builder.and_(builder.fcmp_ordered("==", x, top), inside)
        bits = builder.bitcast(hit, ir.IntType(lanes))
        first = builder.cttz(bits, ir.Constant(ir.IntType(1), 0))
        return builder.add(builder.zext(first, ir.IntType(64)), args[2])

    return sig, codegen


@njit
def row_argmax(q, offset, m, at, value):
    """The first index of the largest of ``q.flat[offset:offset + m]`` (as a scan in
    order with ``>`` finds it), column ``at`` read as ``value``: :func:`_block_argmax`
    on each block of 16 columns, an earlier block's column kept where the blocks' maxima
    tie."""
    greedy = _block_argmax(q, offset, 0, m, at, value)
    if m > BLOCK:
        top = value if greedy == at else q[offset + greedy]
        for base in range(BLOCK, m, BLOCK):
            c = _block_argmax(q, offset, base, m, at, value)
            v = value if c == at else q[offset + c]
            if v > top:
                greedy, top = c, v
    return greedy
