"""Read a GGUF file: metadata and dequantised tensors (REFERENCE.md §10).

Uses the pip `gguf` package (`GGUFReader` + `gguf.quants.dequantize`) when it is installed; otherwise
a small numpy reader below that covers the tensor types SmolLM2-135M-Instruct.Q4_1.gguf uses
(F32, F16, Q4_0, Q4_1, Q8_0). Both give the same fp32 arrays (checked by check_llama.py). The numpy
reader exists because the GPU machine has no `gguf` package and no network.

read_gguf(path) → (meta: dict[str, value], tensors: dict[name, np.ndarray fp32 in numpy (row-major)
order, i.e. GGUF dims reversed: a GGUF [576, 49152] tensor comes back as [49152, 576]]).
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# ggml type ids
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8
_BLOCK = {Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34)}   # (weights, bytes) per block


def read_gguf(path: str | Path, use_pip: bool | None = None):
    """Metadata and fp32 tensors. use_pip None: the pip `gguf` package if importable."""
    if use_pip is None:
        try:
            import gguf  # noqa: F401
            use_pip = True
        except ImportError:
            use_pip = False
    return _read_pip(path) if use_pip else _read_numpy(path)


# --- the pip gguf package ------------------------------------------------------------------------
def _read_pip(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(str(path))
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        try:
            meta[k] = f.contents()
        except Exception:  # pragma: no cover - older gguf without contents()
            meta[k] = None
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(list(t.shape)))
        a = dequantize(np.asarray(t.data), t.tensor_type)
        tensors[t.name] = np.ascontiguousarray(a, dtype=np.float32).reshape(shape)
    return meta, tensors


# --- a minimal numpy reader ----------------------------------------------------------------------
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}


class _Buf:
    def __init__(self, data: memoryview):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.d[self.p:self.p + n]).decode("utf-8", errors="surrogateescape")
        self.p += n
        return s

    def value(self, vt):
        if vt == 8:
            return self.string()
        if vt == 9:
            it, n = self.take("<I"), self.take("<Q")
            if it in _SCALAR and it != 8:
                dt = np.dtype(_SCALAR[it])
                a = np.frombuffer(self.d, dtype=dt, count=n, offset=self.p)
                self.p += n * dt.itemsize
                return a.tolist()
            return [self.value(it) for _ in range(n)]
        return self.take(_SCALAR[vt])


def _read_numpy(path):
    raw = np.memmap(str(path), dtype=np.uint8, mode="r")
    b = _Buf(memoryview(raw))
    if bytes(raw[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    b.p = 4
    version = b.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} not supported")
    n_t, n_kv = b.take("<Q"), b.take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = b.string()
        meta[k] = b.value(b.take("<I"))
    infos = []
    for _ in range(n_t):
        name = b.string()
        nd = b.take("<I")
        dims = [b.take("<Q") for _ in range(nd)]
        infos.append((name, dims, b.take("<I"), b.take("<Q")))
    align = int(meta.get("general.alignment", 32))
    base = (b.p + align - 1) // align * align
    tensors = {}
    for name, dims, tt, off in infos:
        n = int(np.prod(dims))
        shape = tuple(reversed(dims))
        start = base + off
        if tt == F32:
            a = np.frombuffer(raw, dtype="<f4", count=n, offset=start).astype(np.float32)
        elif tt == F16:
            a = np.frombuffer(raw, dtype="<f2", count=n, offset=start).astype(np.float32)
        elif tt in _BLOCK:
            bw, bb = _BLOCK[tt]
            blk = np.asarray(raw[start:start + n // bw * bb]).reshape(-1, bb)
            a = _dequant_blocks(blk, tt)
        else:
            raise ValueError(f"{name}: ggml type {tt} not supported by the numpy reader (pip install gguf)")
        tensors[name] = a.reshape(shape)
    return meta, tensors


def _dequant_blocks(blk: np.ndarray, tt: int) -> np.ndarray:
    d = blk[:, 0:2].copy().view("<f2").astype(np.float32)                    # [nb, 1]
    if tt == Q8_0:
        q = blk[:, 2:34].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if tt == Q4_1:
        m = blk[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = blk[:, 4:20]
    else:  # Q4_0: w = d·(q − 8)
        m = -8.0 * d
        qs = blk[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)      # low nibbles = 0..15
    return (d * q + m).reshape(-1)
